// PromptEncoder: the prompt token ids of task rows, the same wherever a row is used (rollouts,
// held-out evaluation, the SFT warm-up) and the same as the server's chat endpoint gives a chat.
//   kText rows:        `bos`, then the tokenizer's ids (what LlmEngine does with a text prompt);
//   kChat rows:        text::ChatEncoder over the render: the special tokens the model's template
//                      writes as text become their ids, and nothing is added (it wrote its BOS);
//   kBuiltinChat rows: `bos`, then as kChat.
// `bos` is the model's BOS when it adds one to a text prompt, else empty: on an infer rank
// LlmEngine::prompt_prefix() (the tokenizer's special prefix: BOS when the model adds one).
//
// Thread safety: immutable after construction. REQUIRES: `tokenizer` outlives the encoder.
#pragma once

#include <cstdint>
#include <vector>

#include "text/chat_encoder.h"
#include "text/tokenizer.h"
#include "trainer/tasks.h"

namespace crl::trainer {

class PromptEncoder {
 public:
  PromptEncoder(const text::Tokenizer& tokenizer, std::vector<int32_t> bos);

  std::vector<int32_t> encode(const TaskRow& row) const;
  // How a row's answer (and a text row's prompt) is encoded: split_special_tokens as the row says.
  static text::EncodeOptions answer_options(const TaskRow& row);

 private:
  const text::Tokenizer& tokenizer_;
  std::vector<int32_t> bos_;
  text::ChatEncoder chat_;  // no prefix: encode() puts `bos_` in front where a row needs it
};

}  // namespace crl::trainer

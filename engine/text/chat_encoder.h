// ChatEncoder: the token ids of a prompt rendered by a chat template.
//
// A template writes special tokens as text (<s>, <|im_start|>, </s>). A tokenizer.json finds them
// itself (its added tokens), so the rendered text is encoded as one. Sentencepiece would spell
// them out piece by piece, so for tokenizer.model every occurrence of a special piece written <...> (a control
// token of the vocabulary) becomes its id, the longest one where several start at the same place,
// and the text between is encoded as usual. Nothing is added but `prefix`: empty for the model's
// own template, which writes its BOS itself (vLLM encodes a rendered template without adding
// special tokens), the model's BOS for a built-in format. The server's chat endpoint and the
// trainer's "messages" rows both encode here, so both give a conversation the same ids.
//
// Thread safety: immutable after construction; encode() may run on many threads at once.
// REQUIRES: `tokenizer` outlives the encoder.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crl::engine {
class Tokenizer;
}

namespace crl::text {

class ChatEncoder {
 public:
  ChatEncoder(const engine::Tokenizer& tokenizer, std::vector<int32_t> prefix = {});

  // `prefix`, then the ids of `rendered`.
  std::vector<int32_t> encode(const std::string& rendered) const;

 private:
  const engine::Tokenizer& tokenizer_;
  std::vector<int32_t> prefix_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control piece -> id
};

}  // namespace crl::text

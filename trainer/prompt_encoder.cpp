#include "trainer/prompt_encoder.h"

#include "text/tokenizer.h"

namespace crl::trainer {

PromptEncoder::PromptEncoder(const text::Tokenizer& tokenizer, std::vector<int32_t> bos)
    : tokenizer_(tokenizer), bos_(std::move(bos)), chat_(tokenizer) {}

std::vector<int32_t> PromptEncoder::encode(const TaskRow& row) const {
  if (row.kind == PromptKind::kChat) return chat_.encode(row.prompt, &row.literal_spans);
  std::vector<int32_t> ids = bos_;
  const std::vector<int32_t> rest = row.kind == PromptKind::kText
                                        ? tokenizer_.encode(row.prompt, answer_options(row))
                                        : chat_.encode(row.prompt, &row.literal_spans);
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

text::EncodeOptions PromptEncoder::answer_options(const TaskRow& row) {
  text::EncodeOptions options;
  options.split_special_tokens = row.split_special_tokens;
  return options;
}

}  // namespace crl::trainer

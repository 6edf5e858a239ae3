// HfTokenizer: a Hugging Face tokenizer.json (the format of the `tokenizers` library), with
// tokenizer_config.json beside it when present.
//
// encode follows tokenizers' TokenizerImpl::encode step by step:
//   1. added tokens that are not `normalized` are found in the raw text (leftmost, longest;
//      honouring single_word, lstrip, rstrip), splitting it;
//   2. each other part is normalized, and `normalized` added tokens are found in it;
//   3. each remaining part is pre-tokenized into words, and the model (BPE) turns every word into
//      ids;
//   4. with add_special_tokens, the post-processor (TemplateProcessing, Roberta/Bert, ByteLevel,
//      Sequence) adds the model's special tokens; tokenizer_config.json's add_bos_token /
//      add_eos_token replace it with BOS? + $A + EOS? as transformers' fast tokenizers do.
// decode maps ids to token strings (special ones dropped with skip_special_tokens) and runs the
// decoder chain.
//
// Thread safety: immutable after loading (the BPE cache is internally locked); every const
// member may run on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crl::text::hf {

class HfTokenizer {
 public:
  // Loads `tokenizer_json` and, when `tokenizer_config` is non-empty, that tokenizer_config.json
  // and special_tokens_map.json beside it, when they exist. Throws TokenizerFileError ("<file>:
  // <json path>: <what>").
  explicit HfTokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config = "");
  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // `literal_spans`: byte ranges of `text` where special-token literals are text (as
  // split_special_tokens, there only); sorted and disjoint, or nullptr.
  std::vector<int32_t> encode(
      std::string_view text, bool add_special_tokens, bool split_special_tokens,
      const std::vector<std::pair<size_t, size_t>>* literal_spans = nullptr) const;
  // Ids outside [0, vocab_size()) throw std::invalid_argument; ids with no token are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // As decode, but the bytes the tokens stand for without the UTF-8 repair: a byte-level or
  // byte-fallback token that ends inside a character keeps its bytes (no U+FFFD).
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // The ids encode(text, add_special_tokens=true) puts before the text (e.g. BOS).
  const std::vector<int32_t>& special_prefix() const;
  // The token string of `id` ("" when no token has it).
  std::string id_to_token(int32_t id) const;
  int32_t token_to_id(std::string_view token) const;  // -1 when none
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }

 private:
  std::string decode_as(const std::vector<int32_t>& ids, bool skip_special_tokens,
                        bool raw_bytes) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
};

}  // namespace crl::text::hf

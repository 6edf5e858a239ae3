// Pre-tokenizers of Hugging Face tokenizer.json ("pre_tokenizer": {...}): split normalized text
// into the pieces ("words") the model tokenizes one by one. Supported: Split (String or Regex
// pattern, PCRE2 with UTF, UCP and JIT; behaviours Removed, Isolated, MergedWithPrevious,
// MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, use_regex with the GPT-2
// pattern; maps bytes to the byte-level alphabet), Digits (individual_digits), Metaspace
// (replacement, prepend_scheme always/first/never, split), Punctuation (behaviour), Whitespace,
// WhitespaceSplit, BertPreTokenizer, Sequence. Anything else fails naming the type and the JSON
// path.
//
// Thread safety: immutable after construction; split() may run on many threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/hf/json_path.h"

namespace crl::text::hf {

// One piece of the text being pre-tokenized.
struct Piece {
  std::string text;
  // True when the piece begins at byte 0 of the text passed to the tokenizer (not after an added
  // token): Metaspace's prepend_scheme "first" prepends only there.
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by the pieces it splits into (in order; empty pieces are dropped).
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

// The pre-tokenizer described by `j` (tokenizer.json's "pre_tokenizer", found at `at`); nullptr
// for JSON null (the whole normalized text is one piece).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const JsonPath& at);

}  // namespace crl::text::hf

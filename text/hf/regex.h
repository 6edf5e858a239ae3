// Regex: a small PCRE2 wrapper for the tokenizer.json components (Split / Replace patterns, the
// GPT-2 and Whitespace pre-tokenizer patterns) and the tokenizer's own splitting.
//
// Patterns are compiled with PCRE2_UTF | PCRE2_UCP (so \s, \w, \d, \p{..} are Unicode-aware) and
// PCRE2_MULTILINE (Oniguruma's Ruby syntax, which Hugging Face uses: ^ and $ match at line
// boundaries; '.' does not match '\n'), then JIT-compiled when PCRE2 supports it. Oniguruma's
// character classes are kept by rewriting the pattern before compiling: \s / \S also cover U+0085,
// \w / \W are Alphabetic + marks + decimal digits + connector punctuation (not PCRE2's letters +
// numbers + '_'), \h / \H mean a hex digit, and general categories (\p{L}, \P{So}, \p{Letter}, ...)
// follow utf8proc's Unicode tables where PCRE2's are older (the code points it lacks are added as
// explicit ranges). Matching iterates like onig's find_iter: left to
// right, non-overlapping, an empty match directly after the previous match is skipped.
//
// Thread safety: immutable after construction; find_all() may run on many threads at once (match
// data and the JIT stack are thread_local).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/hf/json_path.h"

namespace crl::text::hf {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma / Rust-regex syntax as found in tokenizer.json). A pattern PCRE2
  // rejects fails through at.fail() with PCRE2's message and the offset in the pattern.
  Regex(const std::string& pattern, const JsonPath& at);
  // A regex that matches `literal` exactly (tokenizer.json's {"String": ...} patterns).
  static Regex literal(const std::string& literal, const JsonPath& at);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Appends to `spans` the [begin, end) byte offsets of the matches in `text` (valid UTF-8), left
  // to right and non-overlapping, as Rust's onig / regex find_iter. Empty matches are skipped
  // unless `keep_empty`. Throws std::invalid_argument when `text` is not valid UTF-8 and
  // std::runtime_error when PCRE2 gives up (match or JIT stack limit).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans,
                bool keep_empty = false) const;

  // The pattern as given to the constructor.
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// The regex of a tokenizer.json "pattern" member: {"String": s} (matches s literally) or
// {"Regex": r}. Fails through `at` (the path of the pattern member) on anything else.
Regex parse_pattern(const nlohmann::json& pattern, const JsonPath& at);

}  // namespace crl::text::hf

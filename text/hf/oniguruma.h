// Oniguruma patterns (the regex engine of Hugging Face's tokenizers) rewritten for PCRE2 so that
// it classifies characters as Oniguruma does: \s \S \w \W \h \H become classes with Oniguruma's
// meaning, and the general-category properties \p{..} \P{..} follow utf8proc's Unicode tables
// (PCRE2's own can be older). Used by Regex (regex.h) before it compiles a pattern.
#pragma once

#include <string>

namespace crl::text::hf {

// The PCRE2 pattern (compiled with UTF, UCP) that matches what Oniguruma's `pattern` matches.
std::string rewrite_pattern(const std::string& pattern);

}  // namespace crl::text::hf

// Normalizers of Hugging Face tokenizer.json ("normalizer": {...}): text -> text before the
// pre-tokenizer. Supported: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Strip, Prepend, Replace
// (String or Regex pattern; PCRE2), Sequence, and BertNormalizer. Anything else fails naming the
// type and the JSON path.
//
// Thread safety: immutable after construction; normalize() may run on many threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/hf/json_path.h"

namespace crl::text::hf {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual void normalize(std::string& text) const = 0;
};

// The normalizer described by `j` (tokenizer.json's "normalizer" member, found at `at`);
// nullptr for JSON null (no normalizer).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const JsonPath& at);

}  // namespace crl::text::hf

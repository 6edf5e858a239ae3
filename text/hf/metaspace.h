// What the Metaspace pre-tokenizer and decoder share: where the replacement character (▁) is
// prepended, read from the JSON as Hugging Face reads it.
#pragma once

#include <nlohmann/json.hpp>

#include "text/hf/json_path.h"

namespace crl::text::hf {

enum class PrependScheme { kAlways, kFirst, kNever };

// "prepend_scheme": always | first | never (default always); files from before prepend_scheme
// existed say "add_prefix_space": false instead of "never".
inline PrependScheme parse_prepend_scheme(const nlohmann::json& j, const JsonPath& at) {
  const std::string name = get_string(j, "prepend_scheme", at, "always");
  PrependScheme scheme = PrependScheme::kAlways;
  if (name == "first") {
    scheme = PrependScheme::kFirst;
  } else if (name == "never") {
    scheme = PrependScheme::kNever;
  } else if (name != "always") {
    at.at("prepend_scheme")
        .fail("unknown prepend_scheme \"" + name + "\" (expected always, first or never)");
  }
  if (!get_bool(j, "add_prefix_space", at, true)) {
    if (scheme != PrependScheme::kNever && j.contains("prepend_scheme")) {
      at.at("add_prefix_space").fail("add_prefix_space does not match declared prepend_scheme");
    }
    scheme = PrependScheme::kNever;
  }
  return scheme;
}

}  // namespace crl::text::hf

// Parsing JSON that comes from outside (HTTP bodies, environment replies, sampled tool calls, data
// rows) with a bound on its nesting. nlohmann parses any depth without recursion, but copying or
// dumping the parsed value recurses once a level: ~100,000 nested brackets (200 KB, far under
// every size cap) overflow a thread's stack and kill the process. So such text is refused before
// it is parsed, as Python's json module and serde_json refuse deep input.
#pragma once

#include <string_view>

namespace crl {

// Arrays and objects nested deeper than this are refused (JSON schemas of tools nest far less).
constexpr int kMaxJsonDepth = 256;

// Whether the JSON text `text` nests arrays and objects more than `limit` deep. Brackets inside
// strings do not count; the text need not be valid JSON (the parser judges that).
inline bool json_too_deep(std::string_view text, int limit = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Json::parse(text) without exceptions, discarded (is_discarded()) where the text is not valid
// JSON or nests deeper than kMaxJsonDepth; `too_deep` (optional) tells the two apart.
template <class Json>
Json parse_untrusted_json(std::string_view text, bool* too_deep = nullptr) {
  const bool deep = json_too_deep(text);
  if (too_deep != nullptr) *too_deep = deep;
  // nlohmann's parser stops at a NUL byte and accepts what came before it; JSON has no raw NUL.
  if (deep || text.find('\0') != std::string_view::npos) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace crl

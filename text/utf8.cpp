// UTF-8 helpers for the tokenizer.json components: encoding, validation, Rust-compatible lossy
// decoding (String::from_utf8_lossy: one U+FFFD per maximal invalid subpart), and the GPT-2
// byte-level alphabet used by the ByteLevel pre-tokenizer and decoder.
#include "text/utf8.h"

#include <array>

namespace crl::text {

namespace {

// For a lead byte, the number of bytes of the character and the allowed range of the second byte
// (the later continuation bytes are always 0x80..0xBF). need == 0: not a lead byte.
struct LeadInfo {
  uint8_t need;
  uint8_t lo;
  uint8_t hi;
};

inline LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the longest prefix of s[i..] that is a valid (possibly incomplete) UTF-8 character
// prefix; `complete` says whether it is a whole character. Returns 0 for a byte that cannot start
// a character.
inline size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  const auto b = static_cast<uint8_t>(s[i]);
  const LeadInfo info = lead_info(b);
  complete = false;
  if (info.need == 0) return 0;
  if (info.need == 1) {
    complete = true;
    return 1;
  }
  size_t len = 1;
  for (; len < info.need; ++len) {
    if (i + len >= s.size()) return len;
    const auto c = static_cast<uint8_t>(s[i + len]);
    const uint8_t lo = len == 1 ? info.lo : 0x80;
    const uint8_t hi = len == 1 ? info.hi : 0xBF;
    if (c < lo || c > hi) return len;
  }
  complete = true;
  return len;
}

struct ByteLevelTables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 324> to_byte;  // code points 0..323 cover the whole alphabet

  ByteLevelTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_char[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_char_len(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  bool complete;
  const size_t len = valid_prefix(s, i, complete);
  return complete ? len : 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    // Copy the longest run of ASCII / valid characters in one go.
    size_t run = i;
    bool complete = true;
    size_t len = 0;
    while (run < bytes.size()) {
      if (static_cast<uint8_t>(bytes[run]) < 0x80) {
        ++run;
        continue;
      }
      len = valid_prefix(bytes, run, complete);
      if (!complete) break;
      run += len;
    }
    out.append(bytes.data() + i, run - i);
    i = run;
    if (i < bytes.size()) {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal invalid subpart
      i += len == 0 ? 1 : len;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  // A character is at most 4 bytes: look at the last 3 bytes for an unfinished lead.
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const size_t i = n - k;
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b >= 0x80 && b < 0xC0) continue;  // continuation byte: keep looking back
    if (b < 0x80) return n;
    bool complete;
    const size_t len = valid_prefix(bytes, i, complete);
    // Unfinished only when every byte up to the end belongs to a valid but incomplete character.
    if (!complete && len == k && i + len == n) return i;
    return n;
  }
  return n;
}

const std::string& byte_to_char_utf8(uint8_t b) { return byte_level_tables().to_char[b]; }

int char_to_byte(char32_t cp) {
  if (cp >= 324) return -1;
  return byte_level_tables().to_byte[cp];
}

}  // namespace crl::text

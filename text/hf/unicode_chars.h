// Private helpers for the tokenizer.json components: decoding UTF-8 that is known to be valid, and
// the character classes of Rust's char methods that Hugging Face's normalizers and pre-tokenizers
// use (is_whitespace, is_numeric, is_punctuation, general categories via utf8proc).
#pragma once

#include <utf8proc.h>

#include <cstdint>
#include <string_view>

namespace crl::text::hf {

// Decodes the character at s[i] of valid UTF-8 into `cp`; returns its length in bytes. Bytes that
// are not valid UTF-8 decode as themselves with length 1 (no out-of-bounds reads).
inline size_t decode_utf8(std::string_view s, size_t i, char32_t& cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  const size_t left = s.size() - i;
  if (b0 >= 0xC0 && b0 < 0xE0 && left >= 2) {
    cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 < 0xF0 && left >= 3) {
    cp = ((b0 & 0x0Fu) << 12) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 6) |
         (static_cast<uint8_t>(s[i + 2]) & 0x3Fu);
    return 3;
  }
  if (b0 >= 0xF0 && left >= 4) {
    cp = ((b0 & 0x07u) << 18) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 12) |
         ((static_cast<uint8_t>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<uint8_t>(s[i + 3]) & 0x3Fu);
    return 4;
  }
  cp = b0;
  return 1;
}

// Rust's char::is_whitespace (the Unicode White_Space property).
inline bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

inline utf8proc_category_t char_category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

// Rust's char::is_numeric: general category Nd, Nl or No.
inline bool is_numeric_char(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = char_category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// Hugging Face's is_punc / is_bert_punc: ASCII punctuation or general category P*.
inline bool is_punctuation_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  }
  const auto cat = char_category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

}  // namespace crl::text::hf

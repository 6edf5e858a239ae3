// UTF-8 helpers: the tokenizer.json components, incremental detokenization and the server's text
// fields (which show invalid bytes as U+FFFD).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace crl::text {

// Appends the UTF-8 encoding of code point `cp` to `out`.
void append_utf8(std::string& out, char32_t cp);
// Length in bytes of the valid UTF-8 character starting at s[i]; 0 when s[i..] does not start with
// one (invalid or truncated).
size_t utf8_char_len(std::string_view s, size_t i);
// Rust's String::from_utf8_lossy: every maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// The length of the longest prefix of `bytes` that does not end inside a UTF-8 character that may
// still be completed by more bytes (used by incremental decoding).
size_t utf8_complete_prefix(std::string_view bytes);

// The GPT-2 byte-level alphabet: byte b <-> the code point byte_to_char(b), as UTF-8.
const std::string& byte_to_char_utf8(uint8_t b);
// The byte a byte-level code point stands for; -1 when `cp` is not in the alphabet.
int char_to_byte(char32_t cp);

}  // namespace crl::text

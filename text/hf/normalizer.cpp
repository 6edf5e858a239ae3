// Normalizers of tokenizer.json, matching Hugging Face tokenizers' normalizers/ (see normalizer.h).
// Offsets are not tracked: the engine only needs the normalized text. Every transform has an ASCII
// fast path where the ASCII result is known (Unicode normal forms leave ASCII unchanged).
#include "text/hf/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <vector>

#include "text/hf/regex.h"
#include "text/hf/unicode_chars.h"
#include "text/utf8.h"

namespace crl::text::hf {

namespace {

bool is_ascii(const std::string& s) {
  for (const char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

// Characters that every one of the four normal forms leaves alone and that never combine with a
// neighbour (NFC_QC = NFD_QC = NFKC_QC = NFKD_QC = Yes, canonical combining class 0): CJK
// ideographs, Cyrillic without combining marks, emoji. A string splits into independently
// normalizable parts before such a character.
bool always_stable(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x1F300 && cp <= 0x1FAFF);
}

// As always_stable, for NFC only (adds Latin-1 / Latin Extended / IPA, Cyrillic, kana, Hangul
// syllables, which are precomposed or have no decomposition and do not compose with what precedes).
bool nfc_stable(char32_t cp) {
  return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48A && cp <= 0x52F) ||
         (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || always_stable(cp);
}

bool nfkc_stable(char32_t cp) {
  return cp < 0x80 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48A && cp <= 0x52F) ||
         (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || always_stable(cp);
}

bool decomposed_stable(char32_t cp) { return cp < 0x80 || always_stable(cp); }

// NFC / NFD / NFKC / NFKD through utf8proc. Only the stretches between stable characters (plus the
// character before each stretch, which a following mark may compose with) go through utf8proc.
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {
    if (options & UTF8PROC_COMPOSE) {
      stable_ = (options & UTF8PROC_COMPAT) ? nfkc_stable : nfc_stable;
    } else {
      stable_ = decomposed_stable;
    }
  }

  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;
    std::string out;
    size_t copied = 0;         // text[0, copied) is already in `out`
    size_t prev_start = 0;     // start of the previous character
    bool prev_stable = false;  // whether the previous character was stable
    size_t i = 0;
    const size_t n = text.size();
    while (i < n) {
      char32_t cp;
      size_t len = decode_utf8(text, i, cp);
      if (stable_(cp)) {
        prev_start = i;
        prev_stable = true;
        i += len;
        continue;
      }
      const size_t begin = prev_stable ? prev_start : i;
      size_t end = i + len;
      while (end < n) {
        len = decode_utf8(text, end, cp);
        if (stable_(cp)) break;
        end += len;
      }
      out.append(text, copied, begin - copied);
      map_into(std::string_view(text).substr(begin, end - begin), out);
      copied = end;
      i = end;
      prev_stable = false;
    }
    if (copied == 0) return;
    out.append(text, copied, std::string::npos);
    text.swap(out);
  }

 private:
  void map_into(std::string_view part, std::string& out) const {
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t len =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(part.data()),
                     static_cast<utf8proc_ssize_t>(part.size()), &mapped,
                     static_cast<utf8proc_option_t>(options_));
    if (len < 0) {
      throw std::invalid_argument(std::string("unicode normalization failed: ") +
                                  utf8proc_errmsg(len));
    }
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
    std::free(mapped);
  }

  int options_;
  bool (*stable_)(char32_t);
};

// Rust's char::to_lowercase for every character (U+0130 lowercases to two characters).
void lowercase(std::string& text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n && static_cast<uint8_t>(text[i]) < 0x80) {
    char& c = text[i++];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  if (i == n) return;
  std::string out;
  out.reserve(n + 8);
  out.append(text, 0, i);
  while (i < n) {
    char32_t cp;
    const size_t len = decode_utf8(text, i, cp);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else if (cp == 0x130) {
      out.append("i\xCC\x87");  // "i" + U+0307 COMBINING DOT ABOVE
    } else {
      const auto lower = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
      if (lower == cp) {
        out.append(text, i, len);
      } else {
        append_utf8(out, lower);
      }
    }
    i += len;
  }
  text.swap(out);
}

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override { lowercase(text); }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        char32_t cp;
        const size_t len = decode_utf8(text, begin, cp);
        if (!is_white_space(cp)) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        char32_t cp;
        decode_utf8(text, start, cp);
        if (!is_white_space(cp)) break;
        end = start;
      }
    }
    if (begin != 0 || end != text.size()) text = text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prepend) : prepend_(std::move(prepend)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Replace : public Normalizer {
 public:
  Replace(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    if (text.empty()) return;  // HF reports no match at all in an empty string
    thread_local std::vector<std::pair<size_t, size_t>> spans;
    spans.clear();
    regex_.find_all(text, spans, /*keep_empty=*/true);
    if (spans.empty()) return;
    std::string out;
    out.reserve(text.size() + spans.size() * content_.size());
    size_t last = 0;
    for (const auto& [begin, end] : spans) {
      out.append(text, last, begin - last);
      out += content_;
      last = end;
    }
    out.append(text, last, std::string::npos);
    text.swap(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& part : parts_) part->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Keeps the characters for which keep(cp) is true.
template <typename Keep>
void filter_chars(std::string& text, Keep keep) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    const size_t len = decode_utf8(text, i, cp);
    if (keep(cp)) out.append(text, i, len);
    i += len;
  }
  text.swap(out);
}

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// unicode_categories' is_other: general category Cc, Cf, Cn, Co or Cs.
bool is_other_category(char32_t c) {
  const auto cat = char_category(c);
  return cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CC ||
         cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS;
}

class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        handle_chinese_chars_(handle_chinese_chars),
        strip_accents_(strip_accents),
        lowercase_(lowercase),
        nfd_(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE) {}

  void normalize(std::string& text) const override {
    if (clean_text_) {
      std::string out;
      out.reserve(text.size());
      for (size_t i = 0; i < text.size();) {
        char32_t cp;
        const size_t len = decode_utf8(text, i, cp);
        i += len;
        const bool control = cp != '\t' && cp != '\n' && cp != '\r' && is_other_category(cp);
        if (cp == 0 || cp == 0xFFFD || control) continue;
        if (cp == '\t' || cp == '\n' || cp == '\r' || is_white_space(cp)) {
          out.push_back(' ');
        } else {
          out.append(text, i - len, len);
        }
      }
      text.swap(out);
    }
    if (handle_chinese_chars_ && !is_ascii(text)) {
      std::string out;
      out.reserve(text.size() + 16);
      for (size_t i = 0; i < text.size();) {
        char32_t cp;
        const size_t len = decode_utf8(text, i, cp);
        if (is_chinese_char(cp)) {
          out.push_back(' ');
          out.append(text, i, len);
          out.push_back(' ');
        } else {
          out.append(text, i, len);
        }
        i += len;
      }
      text.swap(out);
    }
    if (strip_accents_ && !is_ascii(text)) {
      nfd_.normalize(text);
      filter_chars(
          text, [](char32_t cp) { return cp < 0x80 || char_category(cp) != UTF8PROC_CATEGORY_MN; });
    }
    if (lowercase_) lowercase(text);
  }

 private:
  bool clean_text_;
  bool handle_chinese_chars_;
  bool strip_accents_;
  bool lowercase_;
  UnicodeNormalizer nfd_;
};

// Removes combining marks (general category M*).
class StripAccents : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;
    filter_chars(text, [](char32_t cp) {
      if (cp < 0x80) return true;
      const auto cat = char_category(cp);
      return cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC &&
             cat != UTF8PROC_CATEGORY_ME;
    });
  }
};

// SentencePiece's NMT normalization: drops ASCII control characters, maps odd spaces to ' '.
class Nmt : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      char32_t cp;
      const size_t len = decode_utf8(text, i, cp);
      i += len;
      if ((cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) || cp == 0x7F ||
          cp == 0x8F || cp == 0x9F) {
        continue;
      }
      const bool space = cp == 0x9 || cp == 0xA || cp == 0xC || cp == 0xD || cp == 0x1680 ||
                         (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 ||
                         cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD;
      if (space) {
        out.push_back(' ');
      } else {
        out.append(text, i - len, len);
      }
    }
    text.swap(out);
  }
};

// Maps every byte to the GPT-2 byte-level alphabet.
class ByteLevelNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size() * 2);
    for (const char c : text) out += byte_to_char_utf8(static_cast<uint8_t>(c));
    text.swap(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const JsonPath& at) {
  if (j.is_null()) return nullptr;
  const std::string type = get_type(j, at);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                               UTF8PROC_COMPAT);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE |
                                               UTF8PROC_COMPAT);
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") {
    return std::make_unique<Strip>(get_bool(j, "strip_left", at, false),
                                   get_bool(j, "strip_right", at, false));
  }
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Nmt") return std::make_unique<Nmt>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Prepend") {
    require(j, "prepend", at);
    return std::make_unique<Prepend>(get_string(j, "prepend", at, ""));
  }
  if (type == "Replace") {
    Regex regex = parse_pattern(require(j, "pattern", at), at.at("pattern"));
    require(j, "content", at);
    return std::make_unique<Replace>(std::move(regex), get_string(j, "content", at, ""));
  }
  if (type == "Sequence") {
    const nlohmann::json& list = require(j, "normalizers", at);
    const JsonPath list_at = at.at("normalizers");
    if (!list.is_array()) list_at.fail(std::string("expected an array, found ") + list.type_name());
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) list_at.at(i).fail("expected a normalizer, found null");
      parts.push_back(make_normalizer(list[i], list_at.at(i)));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "BertNormalizer" || type == "Bert") {
    const bool lower = get_bool(j, "lowercase", at, true);
    return std::make_unique<BertNormalizer>(get_bool(j, "clean_text", at, true),
                                            get_bool(j, "handle_chinese_chars", at, true),
                                            get_bool(j, "strip_accents", at, lower), lower);
  }
  at.at("type").fail("unsupported normalizer type \"" + type + "\"");
}

}  // namespace crl::text::hf

// Decoders of tokenizer.json, matching Hugging Face tokenizers' decoders/ (see decoder.h),
// including their handling of invalid UTF-8 (ByteLevel: String::from_utf8_lossy over all tokens at
// once; ByteFallback: one U+FFFD per byte of an invalid run of <0xXX> tokens).
#include "text/hf/decoder.h"

#include <utility>

#include "text/hf/metaspace.h"
#include "text/hf/regex.h"
#include "text/hf/unicode_chars.h"
#include "text/utf8.h"

namespace crl::text::hf {

namespace {

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Rust's str::replace: every non-overlapping occurrence of `from`, left to right (an empty `from`
// inserts `to` at every character boundary).
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  if (from.empty()) {
    out.reserve(s.size() + (s.size() + 1) * to.size());
    out += to;
    for (size_t i = 0; i < s.size();) {
      char32_t cp;
      const size_t len = decode_utf8(s, i, cp);
      out.append(s, i, len);
      out += to;
      i += len;
    }
    return out;
  }
  size_t pos = s.find(from);
  if (pos == std::string::npos) return s;
  out.reserve(s.size());
  size_t last = 0;
  while (pos != std::string::npos) {
    out.append(s, last, pos - last);
    out += to;
    last = pos + from.size();
    pos = s.find(from, last);
  }
  out.append(s, last, std::string::npos);
  return out;
}

char32_t get_char(const nlohmann::json& j, const std::string& key, const JsonPath& at) {
  const nlohmann::json& v = require(j, key, at);
  if (!v.is_string()) at.at(key).fail(std::string("expected a string, found ") + v.type_name());
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || utf8_char_len(s, 0) != s.size()) {
    at.at(key).fail("expected a single character, found \"" + s + "\"");
  }
  char32_t cp;
  decode_utf8(s, 0, cp);
  return cp;
}

class ByteLevel : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, Bytes mode) const override {
    std::string out;
    size_t total = 0;
    for (const std::string& t : tokens) total += t.size();
    out.reserve(total);
    for (const std::string& t : tokens) {
      const size_t mark = out.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size();) {
        char32_t cp;
        const size_t len = decode_utf8(t, i, cp);
        const int b = char_to_byte(cp);
        if (b < 0) {
          mapped = false;
          break;
        }
        out.push_back(static_cast<char>(b));
        i += len;
      }
      if (!mapped) {  // a character outside the alphabet: the token keeps its own bytes
        out.resize(mark);
        out += t;
      }
    }
    tokens.assign(1, mode == Bytes::kRaw ? std::move(out) : utf8_lossy(out));
  }
};

class Metaspace : public Decoder {
 public:
  Metaspace(char32_t replacement, PrependScheme scheme) : scheme_(scheme) {
    append_utf8(rep_, replacement);
  }
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool drop = i == 0 && scheme_ != PrependScheme::kNever;
      tokens[i] = replace_all(tokens[i], rep_, drop ? "" : " ");
    }
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
};

class Replace : public Decoder {
 public:
  Replace(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    thread_local std::vector<std::pair<size_t, size_t>> spans;
    for (std::string& token : tokens) {
      if (token.empty()) continue;  // HF reports no match at all in an empty string
      spans.clear();
      regex_.find_all(token, spans, /*keep_empty=*/true);
      if (spans.empty()) continue;
      std::string out;
      out.reserve(token.size() + spans.size() * content_.size());
      size_t last = 0;
      for (const auto& [begin, end] : spans) {
        out.append(token, last, begin - last);
        out += content_;
        last = end;
      }
      out.append(token, last, std::string::npos);
      token.swap(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xAB>" token (as Rust's u8::from_str_radix, which also accepts "+A"); -1 if none.
int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int lo = hex_value(t[4]);
  if (lo < 0) return -1;
  if (t[3] == '+') return lo;
  const int hi = hex_value(t[3]);
  return hi < 0 ? -1 : hi * 16 + lo;
}

class ByteFallback : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, Bytes mode) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      size_t i = 0;
      while (i < pending.size()) {
        const size_t len = utf8_char_len(pending, i);
        if (len == 0) break;
        i += len;
      }
      if (i == pending.size() || mode == Bytes::kRaw) {
        out.push_back(std::move(pending));
      } else {
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      const int b = fallback_byte(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class Fuse : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class Strip : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop) : start_(start), stop_(stop) {
    append_utf8(content_, content);
  }
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    const size_t w = content_.size();
    for (std::string& t : tokens) {
      size_t begin = 0;
      for (size_t k = 0; k < start_ && t.compare(begin, w, content_) == 0 && begin + w <= t.size();
           ++k)
        begin += w;
      size_t end = t.size();
      for (size_t k = 0; k < stop_ && end >= begin + w && t.compare(end - w, w, content_) == 0; ++k)
        end -= w;
      if (begin != 0 || end != t.size()) t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

std::string wordpiece_cleanup(const std::string& s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string out = s;
  for (const auto& [from, to] : kRules) {
    if (out.find(from) != std::string::npos) out = replace_all(out, from, to);
  }
  return out;
}

class WordPiece : public Decoder {
 public:
  WordPiece(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          t.insert(0, 1, ' ');
        }
      }
      if (cleanup_) t = wordpiece_cleanup(t);
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeDecoder : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
    }
  }

 private:
  std::string suffix_;
};

class Ctc : public Decoder {
 public:
  Ctc(std::string pad, std::string delimiter, bool cleanup)
      : pad_(std::move(pad)), delimiter_(std::move(delimiter)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens, Bytes /*bytes*/) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 && tokens[i] == tokens[i - 1]) continue;  // dedup consecutive repeats
      std::string t = replace_all(tokens[i], pad_, "");
      if (cleanup_) t = replace_all(wordpiece_cleanup(t), delimiter_, " ");
      if (!t.empty()) out.push_back(std::move(t));
    }
    tokens.swap(out);
  }

 private:
  std::string pad_;
  std::string delimiter_;
  bool cleanup_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens, Bytes mode) const override {
    for (const auto& part : parts_) part->decode_chain(tokens, mode);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

size_t get_count(const nlohmann::json& j, const std::string& key, const JsonPath& at) {
  require(j, key, at);
  const int64_t v = get_int(j, key, at, 0);
  if (v < 0) at.at(key).fail("expected a non-negative integer");
  return static_cast<size_t>(v);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const JsonPath& at) {
  if (j.is_null()) return nullptr;
  const std::string type = get_type(j, at);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace") {
    const char32_t replacement = get_char(j, "replacement", at);
    const PrependScheme scheme = parse_prepend_scheme(j, at);
    return std::make_unique<Metaspace>(replacement, scheme);
  }
  if (type == "Replace") {
    Regex regex = parse_pattern(require(j, "pattern", at), at.at("pattern"));
    require(j, "content", at);
    return std::make_unique<Replace>(std::move(regex), get_string(j, "content", at, ""));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    return std::make_unique<Strip>(get_char(j, "content", at), get_count(j, "start", at),
                                   get_count(j, "stop", at));
  }
  if (type == "WordPiece") {
    return std::make_unique<WordPiece>(get_string(j, "prefix", at, "##"),
                                       get_bool(j, "cleanup", at, true));
  }
  if (type == "BPEDecoder")
    return std::make_unique<BpeDecoder>(get_string(j, "suffix", at, "</w>"));
  if (type == "CTC") {
    return std::make_unique<Ctc>(get_string(j, "pad_token", at, "<pad>"),
                                 get_string(j, "word_delimiter_token", at, "|"),
                                 get_bool(j, "cleanup", at, true));
  }
  if (type == "Sequence") {
    const nlohmann::json& list = require(j, "decoders", at);
    const JsonPath list_at = at.at("decoders");
    if (!list.is_array()) list_at.fail(std::string("expected an array, found ") + list.type_name());
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) list_at.at(i).fail("expected a decoder, found null");
      parts.push_back(make_decoder(list[i], list_at.at(i)));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  at.at("type").fail("unsupported decoder type \"" + type + "\"");
}

}  // namespace crl::text::hf

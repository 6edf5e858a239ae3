#include "text/jinja/lexer.h"

#include <cctype>
#include <cstdlib>

#include "text/jinja/error.h"

namespace crl::text::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string rstrip_all(const std::string& s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return s.substr(0, n);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  Lexer(const std::string& source, const LexerOptions& options, const std::string& name)
      : options_(options), name_(name) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {  // newline normalisation
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();  // keep_trailing_newline=False
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t open = find_tag_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      if (open == src_.size()) {
        emit_text(text);
        pos_ = open;
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char marker = open + 2 < src_.size() ? src_[open + 2] : '\0';
      const bool block_like = kind == '%' || kind == '#';
      if (marker == '-') {
        text = rstrip_all(text);
      } else if (marker != '+' && block_like && options_.lstrip_blocks) {
        text = lstrip_line(text);
      }
      const int tag_line = line_ + count_newlines(src_, pos_, open);
      emit_text(text);
      line_ = tag_line;
      pos_ = open + 2 + (marker == '-' || marker == '+' ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else if (kind == '%' && is_raw_start()) {
        lex_raw();
      } else {
        lex_tag(kind);
      }
    }
    Token eof;
    eof.type = Token::Type::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw TemplateError(TemplateError::Kind::kSyntax, message, name_, line_);
  }

  static int count_newlines(const std::string& s, size_t from, size_t to) {
    int n = 0;
    for (size_t i = from; i < to; ++i) n += s[i] == '\n';
    return n;
  }

  size_t find_tag_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  // lstrip_blocks: drop the spaces/tabs between the last newline (or a line start) and the tag.
  std::string lstrip_line(const std::string& text) const {
    const size_t nl = text.rfind('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !line_starting_) return text;
    for (size_t i = from; i < text.size(); ++i) {
      if (text[i] != ' ' && text[i] != '\t') return text;
    }
    return text.substr(0, from);
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) {
      Token t;
      t.type = Token::Type::kText;
      t.text = text;
      t.line = line_;
      tokens_.push_back(std::move(t));
    }
    line_ += count_newlines(text, 0, text.size());
  }

  void push(Token::Type type, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // After a tag's closing delimiter at pos_: the `-` / trim_blocks handling of what follows.
  void after_tag_end(bool strip, bool plus, bool block_like) {
    const size_t start = pos_;
    if (strip) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (!plus && block_like && options_.trim_blocks && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(src_, start, pos_);
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  void lex_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("unterminated comment ({# without #})");
    const bool strip = end > pos_ && src_[end - 1] == '-';
    const bool plus = end > pos_ && src_[end - 1] == '+';
    line_ += count_newlines(src_, pos_, end);
    pos_ = end + 2;
    after_tag_end(strip, plus, true);
  }

  // `{% raw %}` (pos_ is after "{%" and its marker).
  bool is_raw_start() const {
    size_t i = pos_;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    return src_.compare(i, 2, "%}") == 0;
  }

  void lex_raw() {
    const size_t close = src_.find("%}", pos_);
    const bool strip = src_[close - 1] == '-';
    const bool plus = src_[close - 1] == '+';
    pos_ = close + 2;
    after_tag_end(strip, plus, true);
    // Find {% endraw %} (with optional markers).
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 2)) {
      size_t j = i + 2;
      const char marker = j < src_.size() ? src_[j] : '\0';
      if (marker == '-' || marker == '+') ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      const bool end_strip = j < src_.size() && src_[j] == '-';
      const bool end_plus = j < src_.size() && src_[j] == '+';
      if (end_strip || end_plus) ++j;
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      if (marker == '-') {
        text = rstrip_all(text);
      } else if (marker != '+' && options_.lstrip_blocks) {
        text = lstrip_line(text);
      }
      emit_text(text);
      line_ += count_newlines(src_, pos_ + text.size(), i);
      pos_ = j + 2;
      after_tag_end(end_strip, end_plus, true);
      return;
    }
    fail("unterminated {% raw %} block (no {% endraw %})");
  }

  void lex_tag(char kind) {
    const bool is_block = kind == '%';
    const char close_first = is_block ? '%' : '}';
    push(is_block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, is_block ? "{%" : "{{");
    int depth = 0;  // brackets, so "}}" inside {{ {'a': {'b': 1}} }} is not an end
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size())
        fail(std::string("unterminated tag (") + (is_block ? "{% without %}" : "{{ without }}") +
             ")");
      const char c = src_[pos_];
      // End delimiter, possibly with a - or + marker.
      for (const char m : {'-', '+', '\0'}) {
        size_t at = pos_;
        if (m != '\0') {
          if (c != m) continue;
          ++at;
        }
        if (depth == 0 && src_.compare(at, 2, std::string{close_first, '}'}) == 0 &&
            (m != '+' || is_block)) {
          pos_ = at + 2;
          push(is_block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, is_block ? "%}" : "}}");
          after_tag_end(m == '-', m == '+', is_block);
          return;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        push(Token::Type::kName, src_.substr(pos_, e - pos_));
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "|",  ".",  ",",  ":", "(", ")",
                                     "[",  "]",  "{",  "}",  "<",  ">",  "=", "!"};
        bool matched = false;
        for (const char* op : kOps) {
          const std::string o(op);
          if (src_.compare(pos_, o.size(), o) == 0) {
            if (o == "(" || o == "[" || o == "{") ++depth;
            if (o == ")" || o == "]" || o == "}") --depth;
            push(Token::Type::kOp, o);
            pos_ += o.size();
            matched = true;
            break;
          }
        }
        if (!matched) fail(std::string("unexpected character '") + c + "' in a tag");
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    bool is_float = false;
    while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
      ++e;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        is_float = true;
        e = f;
        while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
      }
    }
    std::string digits;
    for (size_t i = pos_; i < e; ++i) {
      if (src_[i] != '_') digits += src_[i];
    }
    Token t;
    t.line = line_;
    t.text = digits;
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInt;
      t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
  }

  // A string literal with Python's unicode-escape rules (unknown escapes stay as written).
  void lex_string(char quote) {
    const int start_line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) {
        line_ = start_line;
        fail("unterminated string literal");
      }
      const char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= src_.size()) {
        out += c;
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          ++line_;
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size())
            fail("truncated \\" + std::string(1, e) + " escape in a string literal");
          const std::string hex = src_.substr(i, n);
          for (char h : hex) {
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              fail("bad \\" + std::string(1, e) + " escape in a string literal");
          }
          append_utf8(out, static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)));
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // octal, up to 3 digits
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k)
              v = v * 8 + (src_[i++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    Token t;
    t.type = Token::Type::kString;
    t.text = std::move(out);
    t.line = start_line;
    tokens_.push_back(std::move(t));
    pos_ = i + 1;
  }

  LexerOptions options_;
  std::string name_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& options,
                            const std::string& template_name) {
  return Lexer(source, options, template_name).run();
}

}  // namespace crl::text::jinja

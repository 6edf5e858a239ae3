// PCRE2-backed Regex for the tokenizer.json components; see regex.h. The pattern is rewritten so
// that PCRE2 classifies characters as Oniguruma (Hugging Face's regex engine) does, then compiled
// with UTF, UCP and MULTILINE and JIT-compiled; matching reuses thread_local match data and JIT
// stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/hf/regex.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "text/hf/oniguruma.h"
#include "text/utf8.h"

namespace crl::text::hf {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int len = pcre2_get_error_message(code, buf, sizeof(buf));
  if (len < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
}

// Per-thread match state shared by every Regex (only group 0 is ever read).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (data == nullptr || context == nullptr) throw std::bad_alloc();
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

std::string escape_literal(const std::string& s) {
  // \Q...\E quotes everything but a literal "\E", which is split out.
  std::string out = "\\Q";
  size_t i = 0;
  while (true) {
    const size_t pos = s.find("\\E", i);
    if (pos == std::string::npos) {
      out.append(s, i, std::string::npos);
      break;
    }
    out.append(s, i, pos - i);
    out += "\\E\\\\E\\Q";
    i = pos + 2;
  }
  out += "\\E";
  return out;
}

}  // namespace

Regex::Regex(const std::string& pattern, const JsonPath& at) : pattern_(pattern), code_(new Code) {
  const std::string rewritten = rewrite_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    // The offset is in the rewritten pattern; it equals the original one up to the first rewrite.
    at.fail("bad regular expression \"" + pattern + "\": " + pcre2_message(error) + " at offset " +
            std::to_string(offset));
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(const std::string& literal, const JsonPath& at) {
  Regex r(escape_literal(literal), at);
  r.pattern_ = literal;
  return r;
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans,
                     bool keep_empty) const {
  MatchState& st = match_state();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  uint32_t options = 0;  // the first call checks UTF-8 validity of the whole subject
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= n) {
    // The first call goes through pcre2_match, which validates the UTF-8 of the whole subject (and
    // then runs the JIT code); later calls skip the check.
    const int rc = code_->jit && options != 0
                       ? pcre2_jit_match(code_->code, subject, n, pos, options, st.data, st.context)
                       : pcre2_match(code_->code, subject, n, pos, options, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        throw std::invalid_argument("regex " + pattern_ + ": text is not valid UTF-8 (" +
                                    pcre2_message(rc) + ")");
      }
      throw std::runtime_error("regex " + pattern_ + ": " + pcre2_message(rc));
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (begin == end && have_last && last_end == end) {
      // onig: no empty match right after the previous match; retry one character later.
      if (pos >= n) break;
      const size_t len = utf8_char_len(text, pos);
      pos += len == 0 ? 1 : len;
      continue;
    }
    if (begin != end || keep_empty) spans.emplace_back(begin, end);
    have_last = true;
    last_end = end;
    pos = end;
  }
}

Regex parse_pattern(const nlohmann::json& pattern, const JsonPath& at) {
  if (!pattern.is_object() || pattern.size() != 1) {
    at.fail("expected {\"String\": ...} or {\"Regex\": ...}, found " + pattern.dump());
  }
  const auto it = pattern.begin();
  if (!it.value().is_string()) at.at(it.key()).fail("expected a string");
  const std::string& value = it.value().get_ref<const std::string&>();
  if (it.key() == "String") return Regex::literal(value, at.at("String"));
  if (it.key() == "Regex") return Regex(value, at.at("Regex"));
  at.fail("expected {\"String\": ...} or {\"Regex\": ...}, found key \"" + it.key() + "\"");
}

}  // namespace crl::text::hf

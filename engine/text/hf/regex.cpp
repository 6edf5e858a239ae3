// PCRE2-backed Regex for the tokenizer.json components; see regex.h. The pattern is rewritten so that
// PCRE2 classifies characters as Oniguruma (Hugging Face's regex engine) does, then compiled with
// UTF, UCP and MULTILINE and JIT-compiled; matching reuses thread_local match data and JIT stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/text/hf/regex.h"

#include <pcre2.h>

#include <utf8proc.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "engine/text/hf/utf8.h"

namespace crl::text::hf {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// ---- Unicode general categories from utf8proc ----------------------------------------------------
// PCRE2's own Unicode tables can be older than those of Oniguruma (Hugging Face) and utf8proc (e.g.
// Debian bookworm's PCRE2 10.42 has Unicode 14, so U+1FAE8, a Unicode 15 symbol, would be
// unassigned). So \p{..} / \P{..} with a general category are rewritten into explicit code-point
// ranges computed from utf8proc.

using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // sorted, disjoint, inclusive
constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kSurrogateFirst = 0xD800;
constexpr char32_t kSurrogateLast = 0xDFFF;

uint32_t cat_bit(utf8proc_category_t c) { return uint32_t{1} << static_cast<int>(c); }

// Runs of equal utf8proc category over 0..U+10FFFF: (first code point, category). Computed once.
const std::vector<std::pair<char32_t, uint8_t>>& category_runs() {
  static const std::vector<std::pair<char32_t, uint8_t>> runs = [] {
    std::vector<std::pair<char32_t, uint8_t>> r;
    r.reserve(8192);
    int prev = -1;
    for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
      const int cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      if (cat != prev) r.emplace_back(cp, static_cast<uint8_t>(cat));
      prev = cat;
    }
    return r;
  }();
  return runs;
}

// The code points whose utf8proc category is in `mask` (or not in it, when `negate`), surrogates
// left out (PCRE2 rejects them in UTF patterns and they never occur in valid UTF-8).
Ranges category_ranges(uint32_t mask, bool negate) {
  const auto& runs = category_runs();
  Ranges out;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (((mask & (uint32_t{1} << runs[i].second)) != 0) == negate) continue;
    const char32_t first = runs[i].first;
    const char32_t last = i + 1 < runs.size() ? runs[i + 1].first - 1 : kMaxCodePoint;
    if (!out.empty() && out.back().second + 1 == first) {
      out.back().second = last;
    } else {
      out.emplace_back(first, last);
    }
  }
  Ranges clipped;  // remove the surrogates
  for (const auto& [a, b] : out) {
    if (b < kSurrogateFirst || a > kSurrogateLast) {
      clipped.emplace_back(a, b);
      continue;
    }
    if (a < kSurrogateFirst) clipped.emplace_back(a, kSurrogateFirst - 1);
    if (b > kSurrogateLast) clipped.emplace_back(kSurrogateLast + 1, b);
  }
  return clipped;
}

// The general-category mask of a property name as Oniguruma accepts it (short or long name, loose
// matching: case, spaces, '_' and '-' ignored); 0 for names that are not general categories
// (scripts, binary properties), which are left to PCRE2.
uint32_t category_mask(std::string name) {
  std::string key;
  for (const char ch : name) {
    if (ch == ' ' || ch == '_' || ch == '-') continue;
    key += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  }
  const uint32_t lu = cat_bit(UTF8PROC_CATEGORY_LU), ll = cat_bit(UTF8PROC_CATEGORY_LL),
                 lt = cat_bit(UTF8PROC_CATEGORY_LT), lm = cat_bit(UTF8PROC_CATEGORY_LM),
                 lo = cat_bit(UTF8PROC_CATEGORY_LO), mn = cat_bit(UTF8PROC_CATEGORY_MN),
                 mc = cat_bit(UTF8PROC_CATEGORY_MC), me = cat_bit(UTF8PROC_CATEGORY_ME),
                 nd = cat_bit(UTF8PROC_CATEGORY_ND), nl = cat_bit(UTF8PROC_CATEGORY_NL),
                 no = cat_bit(UTF8PROC_CATEGORY_NO), pc = cat_bit(UTF8PROC_CATEGORY_PC),
                 pd = cat_bit(UTF8PROC_CATEGORY_PD), ps = cat_bit(UTF8PROC_CATEGORY_PS),
                 pe = cat_bit(UTF8PROC_CATEGORY_PE), pi = cat_bit(UTF8PROC_CATEGORY_PI),
                 pf = cat_bit(UTF8PROC_CATEGORY_PF), po = cat_bit(UTF8PROC_CATEGORY_PO),
                 sm = cat_bit(UTF8PROC_CATEGORY_SM), sc = cat_bit(UTF8PROC_CATEGORY_SC),
                 sk = cat_bit(UTF8PROC_CATEGORY_SK), so = cat_bit(UTF8PROC_CATEGORY_SO),
                 zs = cat_bit(UTF8PROC_CATEGORY_ZS), zl = cat_bit(UTF8PROC_CATEGORY_ZL),
                 zp = cat_bit(UTF8PROC_CATEGORY_ZP), cc = cat_bit(UTF8PROC_CATEGORY_CC),
                 cf = cat_bit(UTF8PROC_CATEGORY_CF), cs = cat_bit(UTF8PROC_CATEGORY_CS),
                 co = cat_bit(UTF8PROC_CATEGORY_CO), cn = cat_bit(UTF8PROC_CATEGORY_CN);
  struct Entry {
    const char* name;
    uint32_t mask;
  };
  const Entry table[] = {
      {"l", lu | ll | lt | lm | lo}, {"letter", lu | ll | lt | lm | lo},
      {"lc", lu | ll | lt}, {"l&", lu | ll | lt}, {"casedletter", lu | ll | lt},
      {"lu", lu}, {"uppercaseletter", lu}, {"ll", ll}, {"lowercaseletter", ll},
      {"lt", lt}, {"titlecaseletter", lt}, {"lm", lm}, {"modifierletter", lm},
      {"lo", lo}, {"otherletter", lo},
      {"m", mn | mc | me}, {"mark", mn | mc | me}, {"combiningmark", mn | mc | me},
      {"mn", mn}, {"nonspacingmark", mn}, {"mc", mc}, {"spacingmark", mc},
      {"me", me}, {"enclosingmark", me},
      {"n", nd | nl | no}, {"number", nd | nl | no}, {"nd", nd}, {"decimalnumber", nd},
      {"nl", nl}, {"letternumber", nl}, {"no", no}, {"othernumber", no},
      {"p", pc | pd | ps | pe | pi | pf | po}, {"punctuation", pc | pd | ps | pe | pi | pf | po},
      {"pc", pc}, {"connectorpunctuation", pc}, {"pd", pd}, {"dashpunctuation", pd},
      {"ps", ps}, {"openpunctuation", ps}, {"pe", pe}, {"closepunctuation", pe},
      {"pi", pi}, {"initialpunctuation", pi}, {"pf", pf}, {"finalpunctuation", pf},
      {"po", po}, {"otherpunctuation", po},
      {"s", sm | sc | sk | so}, {"symbol", sm | sc | sk | so}, {"sm", sm}, {"mathsymbol", sm},
      {"sc", sc}, {"currencysymbol", sc}, {"sk", sk}, {"modifiersymbol", sk},
      {"so", so}, {"othersymbol", so},
      {"z", zs | zl | zp}, {"separator", zs | zl | zp}, {"zs", zs}, {"spaceseparator", zs},
      {"zl", zl}, {"lineseparator", zl}, {"zp", zp}, {"paragraphseparator", zp},
      {"c", cc | cf | cs | co | cn}, {"other", cc | cf | cs | co | cn},
      {"cc", cc}, {"control", cc}, {"cf", cf}, {"format", cf}, {"cs", cs}, {"surrogate", cs},
      {"co", co}, {"privateuse", co}, {"cn", cn}, {"unassigned", cn},
  };
  for (const Entry& e : table) {
    if (key == e.name) return e.mask;
  }
  return 0;
}

// Adds `r` to the sorted disjoint set `into`.
void add_ranges(Ranges& into, const Ranges& r) {
  into.insert(into.end(), r.begin(), r.end());
  std::sort(into.begin(), into.end());
  Ranges merged;
  for (const auto& iv : into) {
    if (!merged.empty() && iv.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, iv.second);
    } else {
      merged.push_back(iv);
    }
  }
  into = std::move(merged);
}

void append_code_point(std::string& out, char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(cp));
  out += buf;
}

// The ranges as the inside of a PCRE2 character class.
std::string class_body(const Ranges& r) {
  std::string out;
  out.reserve(r.size() * 20);
  for (const auto& [a, b] : r) {
    append_code_point(out, a);
    if (b == a) continue;
    if (b > a + 1) out += '-';
    append_code_point(out, b);
  }
  return out;
}

// Oniguruma's \w (Unicode): Alphabetic, marks, decimal numbers and connector punctuation. PCRE2's
// UCP \w is letters, all numbers and '_' only. Alphabetic (a binary property utf8proc lacks) is
// PCRE2's \p{Alphabetic} plus letters and letter numbers from utf8proc (its general-category part).
// Outside a class Oniguruma also matches the Latin-1 number characters ¹ ² ³ ¼ ½ ¾ (its single-byte
// ctype table), inside a class it does not.
uint32_t word_category_mask() {
  return cat_bit(UTF8PROC_CATEGORY_LU) | cat_bit(UTF8PROC_CATEGORY_LL) | cat_bit(UTF8PROC_CATEGORY_LT) |
         cat_bit(UTF8PROC_CATEGORY_LM) | cat_bit(UTF8PROC_CATEGORY_LO) | cat_bit(UTF8PROC_CATEGORY_NL) |
         cat_bit(UTF8PROC_CATEGORY_MN) | cat_bit(UTF8PROC_CATEGORY_MC) | cat_bit(UTF8PROC_CATEGORY_ME) |
         cat_bit(UTF8PROC_CATEGORY_ND) | cat_bit(UTF8PROC_CATEGORY_PC);
}
constexpr const char* kWordProperty = "\\p{Alphabetic}";
const Ranges kWordLatin1Extra{{0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}};
// Oniguruma's \s is Unicode White_Space, which adds U+0085 to PCRE2's UCP \s.
constexpr const char* kSpaceClass = "\\s\\x{85}";
constexpr const char* kHexClass = "0-9a-fA-F";

// Parses the property after "\p" / "\P" at p[i] (i just past the letter): "{Name}", "{^Name}" or a
// single letter. Returns the category mask (0 if not a general category) and sets `end` past the
// property and flips `negated` for "^".
uint32_t parse_property(const std::string& p, size_t i, size_t& end, bool& negated) {
  if (i >= p.size()) return 0;
  if (p[i] != '{') {
    end = i + 1;
    return category_mask(std::string(1, p[i]));
  }
  const size_t close = p.find('}', i + 1);
  if (close == std::string::npos) return 0;
  std::string name = p.substr(i + 1, close - i - 1);
  if (!name.empty() && name[0] == '^') {
    negated = !negated;
    name.erase(0, 1);
  }
  end = close + 1;
  return category_mask(name);
}

// Rewrites the Oniguruma escapes \s \S \w \W \h \H into PCRE2 classes with the same meaning and
// the general-category properties \p{..} \P{..} into utf8proc code-point ranges. Inside a class
// the ranges of all its category items are merged and written just before the closing ']'.
std::string rewrite_pattern(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  std::vector<Ranges> pending;  // per open class: the category ranges still to write
  size_t i = 0;
  const size_t n = p.size();
  while (i < n) {
    const char c = p[i];
    const bool in_class = !pending.empty();
    if (c == '\\' && i + 1 < n) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E: copied verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? n : end + 2;
        out.append(p, i, stop - i);
        i = stop;
        continue;
      }
      if (e == 'p' || e == 'P') {
        bool negated = e == 'P';
        size_t end = i + 2;
        const uint32_t mask = parse_property(p, i + 2, end, negated);
        if (mask != 0) {
          if (in_class) {
            add_ranges(pending.back(), category_ranges(mask, negated));
          } else {
            const Ranges r = category_ranges(mask, false);
            if (r.empty()) {
              out += negated ? "(?s:.)" : "(?!)";
            } else {
              out += negated ? "[^" : "[";
              out += class_body(r);
              out += ']';
            }
          }
          i = end;
          continue;
        }
        out.append(p, i, 2);  // not a general category: PCRE2's own property
        i += 2;
        continue;
      }
      if (e == 'w' || (e == 'W' && !in_class)) {
        Ranges r = category_ranges(word_category_mask(), false);
        if (in_class) {
          out += kWordProperty;
          add_ranges(pending.back(), r);
        } else {
          add_ranges(r, kWordLatin1Extra);
          out += e == 'W' ? "[^" : "[";
          out += kWordProperty;
          out += class_body(r);
          out += ']';
        }
        i += 2;
        continue;
      }
      const char* cls = nullptr;
      bool negated = false;
      switch (e) {
        case 's': cls = kSpaceClass; break;
        case 'S': cls = kSpaceClass; negated = true; break;
        case 'h': cls = kHexClass; break;
        case 'H': cls = kHexClass; negated = true; break;
        default: break;
      }
      if (cls != nullptr && !in_class) {
        out += negated ? "[^" : "[";
        out += cls;
        out += ']';
      } else if (cls != nullptr && !negated) {
        out += cls;
      } else {
        // Other escapes, and negated ones inside a class (as PCRE2 understands them; rare).
        out.append(p, i, 2);
      }
      i += 2;
      continue;
    }
    if (c == '[') {
      if (in_class && i + 1 < n && p[i + 1] == ':') {  // POSIX class [:alpha:]
        const size_t end = p.find(":]", i + 2);
        if (end != std::string::npos) {
          out.append(p, i, end + 2 - i);
          i = end + 2;
          continue;
        }
      }
      pending.emplace_back();
      out += c;
      ++i;
      // A ']' right after '[' or '[^' is a literal.
      if (i < n && p[i] == '^') out += p[i++];
      if (i < n && p[i] == ']') out += p[i++];
      continue;
    }
    if (c == ']' && in_class) {
      out += class_body(pending.back());
      pending.pop_back();
    }
    out += c;
    ++i;
  }
  return out;
}

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
        throw std::invalid_argument("regex " + pattern_ + ": text is not valid UTF-8 (" + pcre2_message(rc) + ")");
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

// Oniguruma patterns as PCRE2 patterns that classify characters as Oniguruma does; see
// oniguruma.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/hf/oniguruma.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace crl::text::hf {
namespace {

// ---- Unicode general categories from utf8proc
// ---------------------------------------------------- PCRE2's own Unicode tables can be older than
// those of Oniguruma (Hugging Face) and utf8proc (e.g. Debian bookworm's PCRE2 10.42 has Unicode
// 14, so U+1FAE8, a Unicode 15 symbol, is unassigned to it). So \p{..} / \P{..} with a general
// category follow utf8proc: the set is written as PCRE2's own property (a fast table lookup) plus
// explicit ranges for the code points utf8proc puts in the category and PCRE2 does not. Where PCRE2
// puts a code point in the category that utf8proc does not (it cannot be subtracted inside a
// class), the whole set is written as utf8proc's ranges instead (correct, but matching is several
// times slower). The disagreements are found once per process by running PCRE2 over every code
// point.

using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // sorted, disjoint, inclusive
constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kSurrogateFirst = 0xD800;
constexpr char32_t kSurrogateLast = 0xDFFF;
constexpr int kNumCategories = 30;
// PCRE2's names of utf8proc_category_t's values, in enum order (UTF8PROC_CATEGORY_CN = 0 ...).
constexpr const char* kCategoryNames[kNumCategories] = {
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};

uint32_t cat_bit(utf8proc_category_t c) { return uint32_t{1} << static_cast<int>(c); }
uint32_t cat_bit(int c) { return uint32_t{1} << c; }

// A pattern compiled as PCRE2 understands it (no rewriting); used to read PCRE2's tables.
struct NativePattern {
  pcre2_code* code = nullptr;
  pcre2_match_data* data = nullptr;
  explicit NativePattern(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) throw std::logic_error("regex: cannot compile " + pattern);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    data = pcre2_match_data_create(1, nullptr);
    if (data == nullptr) throw std::bad_alloc();
  }
  NativePattern(const NativePattern&) = delete;
  NativePattern& operator=(const NativePattern&) = delete;
  ~NativePattern() {
    pcre2_match_data_free(data);
    pcre2_code_free(code);
  }
  // The start offsets of the (one-character) matches in `s`.
  std::vector<size_t> find_all(const std::string& s) const {
    std::vector<size_t> out;
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos < s.size()) {
      const int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, data, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
      out.push_back(ov[0]);
      pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
    }
    return out;
  }
  bool matches_at_start(const std::string& s) const {
    return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                       PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, data, nullptr) >= 0;
  }
};

void append_utf8(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

struct Disagreement {
  char32_t cp;
  uint8_t ours;   // utf8proc's category
  uint8_t pcre2;  // PCRE2's category
};

struct CategoryTables {
  // Runs of equal utf8proc category over 0..U+10FFFF: (first code point, category).
  std::vector<std::pair<char32_t, uint8_t>> runs;
  // The code points (surrogates left out) whose category differs between utf8proc and PCRE2.
  std::vector<Disagreement> disagreements;
};

// Computed once per process (thread-safe static initialization), a few tens of milliseconds.
const CategoryTables& category_tables() {
  static const CategoryTables tables = [] {
    CategoryTables t;
    t.runs.reserve(8192);
    std::vector<std::string> text(kNumCategories);  // per utf8proc category: all its code points
    int prev = -1;
    for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
      const int cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      if (cat != prev) t.runs.emplace_back(cp, static_cast<uint8_t>(cat));
      prev = cat;
      if (cp < kSurrogateFirst || cp > kSurrogateLast)
        append_utf8(text[static_cast<size_t>(cat)], cp);
    }
    std::vector<std::unique_ptr<NativePattern>> is_cat;
    for (const char* name : kCategoryNames) {
      is_cat.push_back(std::make_unique<NativePattern>(std::string("\\p{") + name + "}"));
    }
    for (int cat = 0; cat < kNumCategories; ++cat) {
      const std::string& s = text[static_cast<size_t>(cat)];
      const NativePattern other(std::string("\\P{") + kCategoryNames[cat] + "}");
      for (const size_t pos : other.find_all(s)) {
        utf8proc_int32_t cp = 0;
        const auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + pos,
                                          static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
        const std::string one = s.substr(pos, static_cast<size_t>(len));
        int theirs = 0;  // Cn unless another category matches
        for (int c = 1; c < kNumCategories; ++c) {
          if (is_cat[static_cast<size_t>(c)]->matches_at_start(one)) {
            theirs = c;
            break;
          }
        }
        t.disagreements.push_back(
            {static_cast<char32_t>(cp), static_cast<uint8_t>(cat), static_cast<uint8_t>(theirs)});
      }
    }
    std::sort(t.disagreements.begin(), t.disagreements.end(),
              [](const Disagreement& x, const Disagreement& y) { return x.cp < y.cp; });
    return t;
  }();
  return tables;
}

// Removes the surrogates from sorted disjoint ranges.
Ranges without_surrogates(const Ranges& in) {
  Ranges out;
  for (const auto& [a, b] : in) {
    if (b < kSurrogateFirst || a > kSurrogateLast) {
      out.emplace_back(a, b);
      continue;
    }
    if (a < kSurrogateFirst) out.emplace_back(a, kSurrogateFirst - 1);
    if (b > kSurrogateLast) out.emplace_back(kSurrogateLast + 1, b);
  }
  return out;
}

// The code points whose utf8proc category is in `mask` (or not in it, when `negate`), surrogates
// left out (PCRE2 rejects them in UTF patterns and they never occur in valid UTF-8).
Ranges category_ranges(uint32_t mask, bool negate) {
  const auto& runs = category_tables().runs;
  Ranges out;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (((mask & cat_bit(runs[i].second)) != 0) == negate) continue;
    const char32_t first = runs[i].first;
    const char32_t last = i + 1 < runs.size() ? runs[i + 1].first - 1 : kMaxCodePoint;
    if (!out.empty() && out.back().second + 1 == first) {
      out.back().second = last;
    } else {
      out.emplace_back(first, last);
    }
  }
  return without_surrogates(out);
}

// utf8proc's set for a category mask relative to PCRE2's: `extra` = code points utf8proc has in the
// set and PCRE2 does not; `exact` = PCRE2 has no code point in the set that utf8proc has not.
struct CategoryDelta {
  Ranges extra;
  bool exact = true;
};

CategoryDelta category_delta(uint32_t mask) {
  CategoryDelta d;
  for (const Disagreement& x : category_tables().disagreements) {
    const bool ours = (mask & cat_bit(x.ours)) != 0;
    const bool theirs = (mask & cat_bit(x.pcre2)) != 0;
    if (theirs && !ours) d.exact = false;
    if (ours && !theirs) {
      if (!d.extra.empty() && d.extra.back().second + 1 == x.cp) {
        d.extra.back().second = x.cp;
      } else {
        d.extra.emplace_back(x.cp, x.cp);
      }
    }
  }
  return d;
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
      {"l", lu | ll | lt | lm | lo},
      {"letter", lu | ll | lt | lm | lo},
      {"lc", lu | ll | lt},
      {"l&", lu | ll | lt},
      {"casedletter", lu | ll | lt},
      {"lu", lu},
      {"uppercaseletter", lu},
      {"ll", ll},
      {"lowercaseletter", ll},
      {"lt", lt},
      {"titlecaseletter", lt},
      {"lm", lm},
      {"modifierletter", lm},
      {"lo", lo},
      {"otherletter", lo},
      {"m", mn | mc | me},
      {"mark", mn | mc | me},
      {"combiningmark", mn | mc | me},
      {"mn", mn},
      {"nonspacingmark", mn},
      {"mc", mc},
      {"spacingmark", mc},
      {"me", me},
      {"enclosingmark", me},
      {"n", nd | nl | no},
      {"number", nd | nl | no},
      {"nd", nd},
      {"decimalnumber", nd},
      {"nl", nl},
      {"letternumber", nl},
      {"no", no},
      {"othernumber", no},
      {"p", pc | pd | ps | pe | pi | pf | po},
      {"punctuation", pc | pd | ps | pe | pi | pf | po},
      {"pc", pc},
      {"connectorpunctuation", pc},
      {"pd", pd},
      {"dashpunctuation", pd},
      {"ps", ps},
      {"openpunctuation", ps},
      {"pe", pe},
      {"closepunctuation", pe},
      {"pi", pi},
      {"initialpunctuation", pi},
      {"pf", pf},
      {"finalpunctuation", pf},
      {"po", po},
      {"otherpunctuation", po},
      {"s", sm | sc | sk | so},
      {"symbol", sm | sc | sk | so},
      {"sm", sm},
      {"mathsymbol", sm},
      {"sc", sc},
      {"currencysymbol", sc},
      {"sk", sk},
      {"modifiersymbol", sk},
      {"so", so},
      {"othersymbol", so},
      {"z", zs | zl | zp},
      {"separator", zs | zl | zp},
      {"zs", zs},
      {"spaceseparator", zs},
      {"zl", zl},
      {"lineseparator", zl},
      {"zp", zp},
      {"paragraphseparator", zp},
      {"c", cc | cf | cs | co | cn},
      {"other", cc | cf | cs | co | cn},
      {"cc", cc},
      {"control", cc},
      {"cf", cf},
      {"format", cf},
      {"cs", cs},
      {"surrogate", cs},
      {"co", co},
      {"privateuse", co},
      {"cn", cn},
      {"unassigned", cn},
  };
  for (const Entry& e : table) {
    if (key == e.name) return e.mask;
  }
  return 0;
}

// PCRE2's name for a mask category_mask() returns.
std::string pcre2_property_name(uint32_t mask) {
  static const std::pair<const char*, std::vector<int>> groups[] = {
      {"L", {1, 2, 3, 4, 5}},
      {"L&", {1, 2, 3}},
      {"M", {6, 7, 8}},
      {"N", {9, 10, 11}},
      {"P", {12, 13, 14, 15, 16, 17, 18}},
      {"S", {19, 20, 21, 22}},
      {"Z", {23, 24, 25}},
      {"C", {0, 26, 27, 28, 29}}};
  for (const auto& [name, cats] : groups) {
    uint32_t m = 0;
    for (const int c : cats) m |= cat_bit(c);
    if (m == mask) return name;
  }
  for (int c = 0; c < kNumCategories; ++c) {
    if (mask == cat_bit(c)) return kCategoryNames[c];
  }
  throw std::logic_error("regex: no PCRE2 name for a category mask");
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

// Joins neighbouring ranges of `r` whose gap holds only code points utf8proc puts in a category of
// `mask` (they are in the class anyway), so that the class has fewer ranges for the JIT to test.
Ranges bridge_gaps(const Ranges& r, uint32_t mask) {
  Ranges out;
  for (const auto& iv : r) {
    if (!out.empty() && mask != 0 &&
        (out.back().second < kSurrogateFirst) == (iv.first < kSurrogateFirst)) {
      bool inside = true;
      for (char32_t cp = out.back().second + 1; cp < iv.first && inside; ++cp) {
        inside = (mask & cat_bit(utf8proc_category(static_cast<utf8proc_int32_t>(cp)))) != 0;
      }
      if (inside) {
        out.back().second = iv.second;
        continue;
      }
    }
    out.push_back(iv);
  }
  return out;
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
// UCP \w is letters, all numbers and '_' only. Written as PCRE2's properties plus the code points
// utf8proc has in L, Nl (the general-category part of Alphabetic, a property utf8proc lacks), M, Nd
// or Pc and PCRE2 has in none of them.
// Outside a class Oniguruma also matches the Latin-1 number characters ¹ ² ³ ¼ ½ ¾ (its single-byte
// ctype table), inside a class it does not.
uint32_t word_category_mask() {
  return cat_bit(UTF8PROC_CATEGORY_LU) | cat_bit(UTF8PROC_CATEGORY_LL) |
         cat_bit(UTF8PROC_CATEGORY_LT) | cat_bit(UTF8PROC_CATEGORY_LM) |
         cat_bit(UTF8PROC_CATEGORY_LO) | cat_bit(UTF8PROC_CATEGORY_NL) |
         cat_bit(UTF8PROC_CATEGORY_MN) | cat_bit(UTF8PROC_CATEGORY_MC) |
         cat_bit(UTF8PROC_CATEGORY_ME) | cat_bit(UTF8PROC_CATEGORY_ND) |
         cat_bit(UTF8PROC_CATEGORY_PC);
}
constexpr const char* kWordNative = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
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

// A character class open in the pattern being rewritten: the ranges still to write (written before
// its ']') and the categories the class holds as PCRE2 properties that agree with utf8proc (see
// bridge_gaps).
struct OpenClass {
  Ranges ranges;
  uint32_t mask = 0;
};

// \p{..} or \P{..} at p[i]: appends its rewrite to `out` (inside a class, `cls`: its ranges join
// the class's); returns the index after it. A property that is not a general category stays
// PCRE2's own.
size_t rewrite_property(const std::string& p, size_t i, std::string& out, OpenClass* cls) {
  bool negated = p[i + 1] == 'P';
  size_t end = i + 2;
  const uint32_t mask = parse_property(p, i + 2, end, negated);
  if (mask == 0) {
    out.append(p, i, 2);
    return i + 2;
  }
  const std::string name = std::string("\\p{") + pcre2_property_name(mask) + "}";
  const CategoryDelta delta = category_delta(mask);
  if (cls) {
    if (delta.exact && !negated) {
      out += name;
      add_ranges(cls->ranges, delta.extra);
      cls->mask |= mask;
    } else if (delta.exact && delta.extra.empty()) {
      out += "\\P" + name.substr(2);
    } else {
      add_ranges(cls->ranges, category_ranges(mask, negated));
    }
  } else if (delta.exact && delta.extra.empty()) {
    out += negated ? "\\P" + name.substr(2) : name;
  } else if (delta.exact) {
    out += negated ? "[^" : "[";
    out += name;
    out += class_body(bridge_gaps(delta.extra, mask));
    out += ']';
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
  return end;
}

// \w, or \W outside a class (inside one it stays PCRE2's): Unicode word characters as Oniguruma
// has them.
void rewrite_word(bool negated, std::string& out, OpenClass* cls) {
  Ranges extra = category_delta(word_category_mask()).extra;
  if (cls) {
    out += kWordNative;
    add_ranges(cls->ranges, extra);
    cls->mask |= word_category_mask();
    return;
  }
  add_ranges(extra, kWordLatin1Extra);
  out += negated ? "[^" : "[";
  out += kWordNative;
  out += class_body(bridge_gaps(extra, word_category_mask()));
  out += ']';
}

// \s \S \h \H as classes; other escapes, and negated ones inside a class (as PCRE2 understands
// them; rare), as they are.
void rewrite_escape(const std::string& p, size_t i, std::string& out, bool in_class) {
  const char* cls = nullptr;
  bool negated = false;
  switch (p[i + 1]) {
    case 's':
      cls = kSpaceClass;
      break;
    case 'S':
      cls = kSpaceClass;
      negated = true;
      break;
    case 'h':
      cls = kHexClass;
      break;
    case 'H':
      cls = kHexClass;
      negated = true;
      break;
    default:
      break;
  }
  if (cls != nullptr && !in_class) {
    out += negated ? "[^" : "[";
    out += cls;
    out += ']';
  } else if (cls != nullptr && !negated) {
    out += cls;
  } else {
    out.append(p, i, 2);
  }
}

}  // namespace

// Rewrites the Oniguruma escapes \s \S \w \W \h \H into PCRE2 classes with the same meaning and
// the general-category properties \p{..} \P{..} into utf8proc code-point ranges. Inside a class
// the ranges of all its category items are merged and written just before the closing ']'.
std::string rewrite_pattern(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  std::vector<OpenClass> pending;
  size_t i = 0;
  const size_t n = p.size();
  while (i < n) {
    const char c = p[i];
    OpenClass* cls = pending.empty() ? nullptr : &pending.back();
    if (c == '\\' && i + 1 < n) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E: copied verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? n : end + 2;
        out.append(p, i, stop - i);
        i = stop;
      } else if (e == 'p' || e == 'P') {
        i = rewrite_property(p, i, out, cls);
      } else if (e == 'w' || (e == 'W' && !cls)) {
        rewrite_word(e == 'W', out, cls);
        i += 2;
      } else {
        rewrite_escape(p, i, out, cls != nullptr);
        i += 2;
      }
      continue;
    }
    if (c == '[') {
      if (cls && i + 1 < n && p[i + 1] == ':') {  // POSIX class [:alpha:]
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
    if (c == ']' && cls) {
      out += class_body(bridge_gaps(cls->ranges, cls->mask));
      pending.pop_back();
    }
    out += c;
    ++i;
  }
  return out;
}

}  // namespace crl::text::hf

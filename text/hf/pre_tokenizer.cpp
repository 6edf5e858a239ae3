// Pre-tokenizers of tokenizer.json, matching Hugging Face tokenizers' pre_tokenizers/ (see
// pre_tokenizer.h). Every splitting pre-tokenizer goes through split_pieces(): the pattern marks
// each piece as a list of match / non-match segments covering it (HF's Pattern::find_matches) and
// the SplitDelimiterBehavior decides which segments become pieces (HF's NormalizedString::split).
#include "text/hf/pre_tokenizer.h"

#include <utility>

#include "text/hf/metaspace.h"
#include "text/hf/regex.h"
#include "text/hf/unicode_chars.h"
#include "text/utf8.h"

namespace crl::text::hf {

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const nlohmann::json& j, const std::string& key, const JsonPath& at,
                        Behavior fallback) {
  const std::string name = get_string(j, key, at, "");
  if (name.empty()) return fallback;
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  at.at(key).fail("unknown split behavior \"" + name + "\"");
}

// One character given as a JSON string of exactly one code point.
char32_t get_char(const nlohmann::json& j, const std::string& key, const JsonPath& at,
                  char32_t fallback) {
  const std::string s = get_string(j, key, at, "");
  if (s.empty() && (!j.contains(key) || j[key].is_null())) return fallback;
  const size_t len = utf8_char_len(s, 0);
  if (s.empty() || len != s.size())
    at.at(key).fail("expected a single character, found \"" + s + "\"");
  char32_t cp;
  decode_utf8(s, 0, cp);
  return cp;
}

struct Segment {
  size_t begin;
  size_t end;
  bool match;
};

// Segments of `text` from regex matches (empty matches included, as onig reports them).
void regex_segments(const Regex& regex, std::string_view text, bool invert,
                    std::vector<Segment>& segs) {
  thread_local std::vector<std::pair<size_t, size_t>> spans;
  spans.clear();
  regex.find_all(text, spans, /*keep_empty=*/true);
  size_t prev = 0;
  for (const auto& [begin, end] : spans) {
    if (prev != begin) segs.push_back({prev, begin, invert});
    segs.push_back({begin, end, !invert});
    prev = end;
  }
  if (prev != text.size()) segs.push_back({prev, text.size(), invert});
}

// Segments of `text` where every character with pred(cp) is a one-character match.
template <typename Pred>
void char_segments(std::string_view text, Pred pred, std::vector<Segment>& segs) {
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    const size_t len = decode_utf8(text, i, cp);
    if (pred(cp)) {
      if (last < i) segs.push_back({last, i, false});
      segs.push_back({i, i + len, true});
      last = i + len;
    }
    i += len;
  }
  if (last < text.size()) segs.push_back({last, text.size(), false});
}

// Applies `behavior` to the segments of `piece` and appends the resulting non-empty pieces to
// `out`.
void emit_pieces(Piece&& piece, std::vector<Segment>& segs, Behavior behavior,
                 std::vector<Piece>& out) {
  // Fold the segments into ranges to keep (in place: segs[0..kept) with match = "remove").
  size_t kept = 0;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (auto& s : segs) s.match = false;
      kept = segs.size();
      break;
    case Behavior::kRemoved:
      kept = segs.size();
      break;
    case Behavior::kContiguous:
      for (const Segment s : segs) {
        if (kept > 0 && s.match == previous_match) {
          segs[kept - 1].end = s.end;
        } else {
          segs[kept++] = {s.begin, s.end, false};
        }
        previous_match = s.match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Segment s : segs) {
        if (kept > 0 && s.match && !previous_match) {
          segs[kept - 1].end = s.end;
        } else {
          segs[kept++] = {s.begin, s.end, false};
        }
        previous_match = s.match;
      }
      break;
    case Behavior::kMergedWithNext: {
      // Fold from the back, writing the kept ranges at the back of segs, then shift them down.
      size_t write = segs.size();
      for (size_t r = segs.size(); r-- > 0;) {
        const Segment s = segs[r];
        if (write < segs.size() && s.match && !previous_match) {
          segs[write].begin = s.begin;
        } else {
          segs[--write] = {s.begin, s.end, false};
        }
        previous_match = s.match;
      }
      for (size_t r = write; r < segs.size(); ++r) segs[kept++] = segs[r];
      break;
    }
  }
  // The common case of a piece that stays whole keeps its string.
  if (kept == 1 && !segs[0].match && segs[0].begin == 0 && segs[0].end == piece.text.size()) {
    out.push_back(std::move(piece));
    return;
  }
  for (size_t k = 0; k < kept; ++k) {
    const Segment& s = segs[k];
    if (s.match || s.begin == s.end) continue;
    out.push_back(
        Piece{piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

void drop_empty(std::vector<Piece>& pieces) {
  size_t kept = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (pieces[p].text.empty()) continue;
    if (kept != p) pieces[kept] = std::move(pieces[p]);
    ++kept;
  }
  pieces.resize(kept);
}

// Runs segment(text, segs) for every piece and splits it with `behavior`.
template <typename SegmentFn>
void split_pieces(std::vector<Piece>& pieces, Behavior behavior, SegmentFn segment) {
  thread_local std::vector<Segment> segs;
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (Piece& piece : pieces) {
    if (piece.text.empty()) continue;
    segs.clear();
    segment(std::string_view(piece.text), segs);
    emit_pieces(std::move(piece), segs, behavior, out);
  }
  pieces.swap(out);
}

class Split : public PreTokenizer {
 public:
  Split(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, behavior_, [this](std::string_view text, std::vector<Segment>& segs) {
      regex_segments(regex_, text, invert_, segs);
    });
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// The GPT-2 pattern of the ByteLevel pre-tokenizer.
const Regex& gpt2_regex() {
  static const Regex regex(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      JsonPath{"(builtin)", "ByteLevel"});
  return regex;
}

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void split(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& piece : pieces) {
        if (!piece.text.empty() && piece.text[0] != ' ') piece.text.insert(0, 1, ' ');
      }
    }
    if (use_regex_) {
      const Regex& regex = gpt2_regex();
      split_pieces(pieces, Behavior::kIsolated,
                   [&regex](std::string_view text, std::vector<Segment>& segs) {
                     regex_segments(regex, text, false, segs);
                   });
    }
    drop_empty(pieces);
    std::string mapped;
    for (Piece& piece : pieces) {
      mapped.clear();
      mapped.reserve(piece.text.size() * 2);
      for (const char c : piece.text) mapped += byte_to_char_utf8(static_cast<uint8_t>(c));
      piece.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

class Metaspace : public PreTokenizer {
 public:
  Metaspace(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    append_utf8(rep_, replacement);
  }
  void split(std::vector<Piece>& pieces) const override {
    for (Piece& piece : pieces) {
      if (piece.text.empty()) continue;
      if (piece.text.find(' ') != std::string::npos) {
        std::string out;
        out.reserve(piece.text.size() + 16);
        for (const char c : piece.text) {
          if (c == ' ') {
            out += rep_;
          } else {
            out.push_back(c);
          }
        }
        piece.text.swap(out);
      }
      const bool starts = piece.text.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && piece.at_start))) {
        piece.text.insert(0, rep_);
      }
    }
    if (!split_) {
      drop_empty(pieces);
    } else {
      const char32_t rep = replacement_;
      split_pieces(pieces, Behavior::kMergedWithNext,
                   [rep](std::string_view text, std::vector<Segment>& segs) {
                     char_segments(
                         text, [rep](char32_t cp) { return cp == rep; }, segs);
                   });
    }
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// Splits on characters matching a predicate (Digits, Punctuation, WhitespaceSplit,
// BertPreTokenizer, CharDelimiterSplit).
template <typename Pred>
class CharSplit : public PreTokenizer {
 public:
  CharSplit(Pred pred, Behavior behavior) : pred_(pred), behavior_(behavior) {}
  void split(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, behavior_, [this](std::string_view text, std::vector<Segment>& segs) {
      char_segments(text, pred_, segs);
    });
  }

 private:
  Pred pred_;
  Behavior behavior_;
};

template <typename Pred>
std::unique_ptr<PreTokenizer> make_char_split(Pred pred, Behavior behavior) {
  return std::make_unique<CharSplit<Pred>>(pred, behavior);
}

// Whitespace: keeps the matches of Rust regex's \w+|[^\w\s]+ (\w = Alphabetic, marks, decimal
// numbers, connector punctuation, join controls).
class Whitespace : public PreTokenizer {
 public:
  void split(std::vector<Piece>& pieces) const override {
    static const Regex regex(
        R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s]+)",
        JsonPath{"(builtin)", "Whitespace"});
    split_pieces(pieces, Behavior::kRemoved, [](std::string_view text, std::vector<Segment>& segs) {
      regex_segments(regex, text, /*invert=*/true, segs);
    });
  }
};

class BertPreTokenizer : public PreTokenizer {
 public:
  void split(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, Behavior::kRemoved, [](std::string_view text, std::vector<Segment>& segs) {
      char_segments(text, is_white_space, segs);
    });
    split_pieces(pieces, Behavior::kIsolated,
                 [](std::string_view text, std::vector<Segment>& segs) {
                   char_segments(text, is_punctuation_char, segs);
                 });
  }
};

class FixedLength : public PreTokenizer {
 public:
  explicit FixedLength(size_t length) : length_(length) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& piece : pieces) {
      const std::string& t = piece.text;
      size_t begin = 0;
      while (begin < t.size()) {
        size_t end = begin;
        for (size_t c = 0; c < length_ && end < t.size(); ++c) {
          char32_t cp;
          end += decode_utf8(t, end, cp);
        }
        out.push_back(Piece{t.substr(begin, end - begin), piece.at_start && begin == 0});
        begin = end;
      }
    }
    pieces.swap(out);
  }

 private:
  size_t length_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& part : parts_) part->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const JsonPath& at) {
  if (j.is_null()) return nullptr;
  const std::string type = get_type(j, at);
  if (type == "Split") {
    Regex regex = parse_pattern(require(j, "pattern", at), at.at("pattern"));
    require(j, "behavior", at);
    const Behavior behavior = parse_behavior(j, "behavior", at, Behavior::kIsolated);
    return std::make_unique<Split>(std::move(regex), behavior, get_bool(j, "invert", at, false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(get_bool(j, "add_prefix_space", at, true),
                                       get_bool(j, "use_regex", at, true));
  }
  if (type == "Metaspace") {
    require(j, "replacement", at);
    const char32_t replacement = get_char(j, "replacement", at, 0x2581);
    const PrependScheme scheme = parse_prepend_scheme(j, at);
    return std::make_unique<Metaspace>(replacement, scheme, get_bool(j, "split", at, true));
  }
  if (type == "Digits") {
    const bool individual = get_bool(j, "individual_digits", at, false);
    return make_char_split(is_numeric_char,
                           individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Punctuation") {
    return make_char_split(is_punctuation_char,
                           parse_behavior(j, "behavior", at, Behavior::kIsolated));
  }
  if (type == "Whitespace") return std::make_unique<Whitespace>();
  if (type == "WhitespaceSplit") return make_char_split(is_white_space, Behavior::kRemoved);
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "CharDelimiterSplit" || type == "Delimiter") {
    require(j, "delimiter", at);
    const char32_t delimiter = get_char(j, "delimiter", at, 0);
    return make_char_split([delimiter](char32_t cp) { return cp == delimiter; },
                           Behavior::kRemoved);
  }
  if (type == "FixedLength") {
    const int64_t length = get_int(j, "length", at, 5);
    if (length <= 0) at.at("length").fail("expected a positive length");
    return std::make_unique<FixedLength>(static_cast<size_t>(length));
  }
  if (type == "Sequence") {
    const nlohmann::json& list = require(j, "pretokenizers", at);
    const JsonPath list_at = at.at("pretokenizers");
    if (!list.is_array()) list_at.fail(std::string("expected an array, found ") + list.type_name());
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) list_at.at(i).fail("expected a pre-tokenizer, found null");
      parts.push_back(make_pre_tokenizer(list[i], list_at.at(i)));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  at.at("type").fail("unsupported pre-tokenizer type \"" + type + "\"");
}

}  // namespace crl::text::hf

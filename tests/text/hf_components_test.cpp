// Tests of the tokenizer.json components (text/hf: utf8, regex, normalizer, pre_tokenizer,
// decoder). Expected values come from Hugging Face tokenizers 0.23 (the Node binding) run on the
// same configurations, including the pre-tokenizers of the Qwen3, Llama-3 and GPT-4o tokenizer.json
// files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/hf/decoder.h"
#include "text/hf/normalizer.h"
#include "text/hf/pre_tokenizer.h"
#include "text/hf/regex.h"
#include "text/utf8.h"

namespace crl::text::hf {
namespace {

using Json = nlohmann::json;
using Strings = std::vector<std::string>;

const JsonPath kRoot{"tokenizer.json", ""};

std::string normalize(const char* config, std::string text) {
  auto n = make_normalizer(Json::parse(config), kRoot.at("normalizer"));
  n->normalize(text);
  return text;
}

Strings pre_tokenize(const std::string& config, const std::string& text, bool at_start = true) {
  auto p = make_pre_tokenizer(Json::parse(config), kRoot.at("pre_tokenizer"));
  std::vector<Piece> pieces{Piece{text, at_start}};
  p->split(pieces);
  Strings out;
  for (const Piece& piece : pieces) out.push_back(piece.text);
  return out;
}

std::string decode(const char* config, Strings tokens) {
  auto d = make_decoder(Json::parse(config), kRoot.at("decoder"));
  d->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

// The error message of building a component, or "" when it builds.
template <typename Make>
std::string error_of(Make make, const char* config, const char* member) {
  try {
    make(Json::parse(config), kRoot.at(member));
  } catch (const TokenizerFileError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// utf8

TEST(HfComponentsUtf8, ByteLevelAlphabet) {
  EXPECT_EQ(byte_to_char_utf8(' '), "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(byte_to_char_utf8('\n'), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(byte_to_char_utf8('a'), "a");
  EXPECT_EQ(byte_to_char_utf8(0xAD), "\xC5\x83");  // the soft hyphen is not printable: U+0143
  EXPECT_EQ(char_to_byte(U'a'), 'a');
  EXPECT_EQ(char_to_byte(0x100), 0);
  EXPECT_EQ(char_to_byte(0x120), ' ');
  EXPECT_EQ(char_to_byte(0x4E00), -1);
  EXPECT_EQ(char_to_byte(0x144), -1);
  for (int b = 0; b < 256; ++b) {
    const std::string& s = byte_to_char_utf8(static_cast<uint8_t>(b));
    ASSERT_EQ(utf8_char_len(s, 0), s.size());
    char32_t cp = static_cast<uint8_t>(s[0]);
    if (s.size() == 2) cp = ((cp & 0x1F) << 6) | (static_cast<uint8_t>(s[1]) & 0x3F);
    EXPECT_EQ(char_to_byte(cp), b);
  }
}

TEST(HfComponentsUtf8, CharLen) {
  EXPECT_EQ(utf8_char_len("a", 0), 1u);
  EXPECT_EQ(utf8_char_len("\xC3\xA9", 0), 2u);
  EXPECT_EQ(utf8_char_len("\xE2\x82\xAC", 0), 3u);
  EXPECT_EQ(utf8_char_len("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(utf8_char_len("\xE2\x82", 0), 0u);          // truncated
  EXPECT_EQ(utf8_char_len("\x80", 0), 0u);              // lone continuation
  EXPECT_EQ(utf8_char_len("\xC0\xAF", 0), 0u);          // overlong
  EXPECT_EQ(utf8_char_len("\xED\xA0\x80", 0), 0u);      // surrogate
  EXPECT_EQ(utf8_char_len("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
}

TEST(HfComponentsUtf8, LossyMatchesRust) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(utf8_lossy("a\xE2\x82"), "a" + r);  // truncated 3-byte char: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xE2\x82"
                       "b"),
            r + "b");
  EXPECT_EQ(utf8_lossy("\x80\x80"), r + r);          // each lone continuation byte
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), r + r);          // overlong: C0 is never valid
  EXPECT_EQ(utf8_lossy("\xE0\x80\xAF"), r + r + r);  // overlong 3-byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);  // surrogate
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98x"), r + "x");   // truncated 4-byte char
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(utf8_lossy("\xFF"
                       "a\xF0\x9F\x98\x80"),
            r + "a\xF0\x9F\x98\x80");
  EXPECT_EQ(utf8_lossy(""), "");
}

TEST(HfComponentsUtf8, CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F"), 0u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(utf8_complete_prefix("ab\x80"), 3u);  // invalid, cannot be completed
  EXPECT_EQ(utf8_complete_prefix("ab\xE2"
                                 "c"),
            4u);                                 // the broken char is not at the end
  EXPECT_EQ(utf8_complete_prefix("a\xC0"), 2u);  // C0 never starts a character
}

// ---------------------------------------------------------------------------------------------
// Regex

TEST(HfComponentsRegex, FindAllByteOffsets) {
  Regex re(R"(\p{N}{1,3})", kRoot);
  std::vector<std::pair<size_t, size_t>> spans;
  re.find_all(
      "a12345 \xC3\xA9"
      "7",
      spans);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0], std::make_pair(size_t{1}, size_t{4}));
  EXPECT_EQ(spans[1], std::make_pair(size_t{4}, size_t{6}));
  EXPECT_EQ(spans[2], std::make_pair(size_t{9}, size_t{10}));
}

TEST(HfComponentsRegex, EmptyMatchesLikeOniguruma) {
  Regex re("x*", kRoot);
  std::vector<std::pair<size_t, size_t>> spans;
  re.find_all("axxb", spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], std::make_pair(size_t{1}, size_t{3}));
  spans.clear();
  re.find_all("axxb", spans, /*keep_empty=*/true);
  // onig: empty at 0, "xx", (no empty at 3 right after the match), empty at 4.
  const std::vector<std::pair<size_t, size_t>> expected{{0, 0}, {1, 3}, {4, 4}};
  EXPECT_EQ(spans, expected);
}

TEST(HfComponentsRegex, OnigurumaClasses) {
  std::vector<std::pair<size_t, size_t>> spans;
  Regex(R"(\s+)", kRoot)
      .find_all(
          "a\xC2\x85"
          "b",
          spans);  // U+0085 is whitespace in onig
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], std::make_pair(size_t{1}, size_t{3}));
  spans.clear();
  Regex(R"(\w+)", kRoot).find_all("e\xCC\x81x", spans);  // marks are word characters
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].second, 4u);
  spans.clear();
  Regex("^.", kRoot).find_all("a\nb", spans);  // ^ matches after every newline
  EXPECT_EQ(spans.size(), 2u);
}

// General categories follow utf8proc (Unicode 15, as Hugging Face's onig), not PCRE2's own tables,
// which can be older: U+1FAE8 (shaking face, new in Unicode 15) is an other symbol.
TEST(HfComponentsRegex, CategoriesFollowUtf8proc) {
  const std::string shaking = "\xF0\x9F\xAB\xA8";  // U+1FAE8
  const std::string melting = "\xF0\x9F\xAB\xA0";  // U+1FAE0 (Unicode 14)
  std::vector<std::pair<size_t, size_t>> spans;
  for (const char* pattern :
       {R"(\p{S})", R"(\p{So})", R"([\p{P}\p{S}])", R"(\p{Symbol})", R"([^\P{S}])"}) {
    spans.clear();
    Regex(pattern, kRoot).find_all("a" + shaking + "b", spans);
    ASSERT_EQ(spans.size(), 1u) << pattern;
    EXPECT_EQ(spans[0], std::make_pair(size_t{1}, size_t{5})) << pattern;
  }
  for (const char* pattern :
       {R"(\P{S})", R"(\p{^S})", R"([^\p{S}])", R"(\p{Cn})", R"(\p{L})", R"([\p{L}\p{N}])"}) {
    spans.clear();
    Regex(pattern, kRoot).find_all(shaking, spans);
    EXPECT_TRUE(spans.empty()) << pattern;
  }
  spans.clear();
  Regex(R"(\p{Lo}+)", kRoot)
      .find_all("\xF0\xB1\x8D\x90", spans);  // U+31350 (CJK Ext. H, Unicode 15)
  EXPECT_EQ(spans.size(), 1u);
  spans.clear();
  Regex(R"(\w+)", kRoot).find_all("\xF0\xB1\x8D\x90", spans);
  EXPECT_EQ(spans.size(), 1u);

  // DeepSeek-V3's pre-tokenizer pattern; Hugging Face (tokenizers 0.2x) splits this text into
  // "🫠🫨\n", "\t\n" and "(((" (tokens ðŁ « ł ðŁ « ¨ Ċ | ĉĊ | ((( ).
  Regex deepseek(
      "[!\"#$%&'()*+,\\-./"
      ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
      kRoot);
  spans.clear();
  deepseek.find_all(melting + shaking + "\n\t\n(((", spans);
  const std::vector<std::pair<size_t, size_t>> expected{{0, 9}, {9, 11}, {11, 14}};
  EXPECT_EQ(spans, expected);
}

TEST(HfComponentsRegex, LiteralAndErrors) {
  std::vector<std::pair<size_t, size_t>> spans;
  Regex::literal("a.b\\E(", kRoot).find_all("axb a.b\\E( a.b", spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], std::make_pair(size_t{4}, size_t{10}));
  try {
    Regex("(ab", JsonPath{"tokenizer.json", "pre_tokenizer.pattern.Regex"});
    FAIL() << "expected an error";
  } catch (const TokenizerFileError& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("tokenizer.json: pre_tokenizer.pattern.Regex: bad regular expression \"(ab\""),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("at offset 3"), std::string::npos) << what;
  }
  EXPECT_THROW(Regex("a", kRoot).find_all("\xFF", spans), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Normalizers

TEST(HfComponentsNormalizer, UnicodeForms) {
  EXPECT_EQ(normalize(R"({"type":"NFC"})", "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(normalize(R"({"type":"NFD"})", "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(normalize(R"({"type":"NFKC"})", "\xEF\xAC\x81"), "fi");  // U+FB01 ligature
  EXPECT_EQ(normalize(R"({"type":"NFKD"})", "\xE2\x91\xA0"), "1");   // circled one
  EXPECT_EQ(normalize(R"({"type":"NFC"})", "plain ascii"), "plain ascii");
  // Only the stretches around combining characters are renormalized; the rest is kept as is.
  EXPECT_EQ(normalize(R"({"type":"NFC"})",
                      "\xE4\xBD\xA0 e\xCC\x81 \xEA\xB0\x80\xE1\x86\xA8 \xD0\xB8\xCC\x86!"),
            "\xE4\xBD\xA0 \xC3\xA9 \xEA\xB0\x81 \xD0\xB9!");  // 你 é 각 й
  EXPECT_EQ(normalize(R"({"type":"NFD"})", "\xE4\xBD\xA0\xEA\xB0\x81"),
            "\xE4\xBD\xA0\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
}

TEST(HfComponentsNormalizer, LowercaseStripPrependReplace) {
  // U+0130 lowercases to "i" + U+0307 as Rust's char::to_lowercase; Σ -> σ per character.
  EXPECT_EQ(normalize(R"({"type":"Lowercase"})", "\xC4\xB0STANBUL \xCE\xA3\xCE\x91\xCE\xA3"),
            "i\xCC\x87stanbul \xCF\x83\xCE\xB1\xCF\x83");
  EXPECT_EQ(
      normalize(R"({"type":"Strip","strip_left":true,"strip_right":true})", "\xE3\x80\x80 a b\n\t"),
      "a b");
  EXPECT_EQ(normalize(R"({"type":"Strip","strip_left":false,"strip_right":true})", "  a  "), "  a");
  EXPECT_EQ(normalize(R"({"type":"Prepend","prepend":"\u2581"})", "hi"), "\xE2\x96\x81hi");
  EXPECT_EQ(normalize(R"({"type":"Prepend","prepend":"\u2581"})", ""), "");
  EXPECT_EQ(normalize(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":"_"})", "a  b\n c"),
            "a_b_c");
  EXPECT_EQ(normalize(R"({"type":"Replace","pattern":{"String":"."},"content":"<dot>"})", "a.b"),
            "a<dot>b");
}

TEST(HfComponentsNormalizer, Llama2Sequence) {
  const char* config = R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"\u2581"},
      {"type":"Replace","pattern":{"String":" "},"content":"\u2581"}]})";
  EXPECT_EQ(normalize(config, "Hello world"), "\xE2\x96\x81Hello\xE2\x96\x81world");
  EXPECT_EQ(normalize(config, ""), "");
}

TEST(HfComponentsNormalizer, BertNormalizer) {
  const char* config =
      R"({"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true})";
  EXPECT_EQ(normalize(config, "Hello  World!"), "hello  world!");
  // NBSP -> ' ', accents stripped (lowercase implies strip_accents), CJK chars spaced out.
  EXPECT_EQ(normalize(config, "H\xC3\x89llo\xC2\xA0w\xC3\xB6rld \xE4\xBD\xA0\xE5\xA5\xBD"),
            "hello world  \xE4\xBD\xA0  \xE5\xA5\xBD ");
  EXPECT_EQ(normalize(config, std::string("a\x01\0b", 4)), "ab");
}

TEST(HfComponentsNormalizer, ErrorsNameThePath) {
  const std::string e1 = error_of(
      make_normalizer,
      R"({"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Precompiled"}]})", "normalizer");
  EXPECT_EQ(e1,
            "tokenizer.json: normalizer.normalizers[1].type: unsupported normalizer type "
            "\"Precompiled\"");
  const std::string e2 =
      error_of(make_normalizer, R"({"type":"Replace","content":"x"})", "normalizer");
  EXPECT_EQ(e2, "tokenizer.json: normalizer.pattern: missing");
  const std::string e3 =
      error_of(make_normalizer, R"({"type":"Replace","pattern":{"Regex":"[a"},"content":"x"})",
               "normalizer");
  EXPECT_NE(e3.find("tokenizer.json: normalizer.pattern.Regex: bad regular expression"),
            std::string::npos)
      << e3;
  EXPECT_EQ(make_normalizer(Json(nullptr), kRoot), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

const char* kQwen3 = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
  "behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]})";
const char* kLlama3 = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
  "behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
const char* kGpt4o = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
  "behavior":"Removed","invert":true},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";

const std::string kSample = "Hello world, I'M here 12345!\n\n  foo\tbar  ";

TEST(HfComponentsPreTokenizer, Qwen3) {
  EXPECT_EQ(pre_tokenize(kQwen3, kSample),
            (Strings{"Hello", "\xC4\xA0world", ",", "\xC4\xA0I", "'M", "\xC4\xA0here", "\xC4\xA0",
                     "1", "2", "3", "4", "5", "!\xC4\x8A\xC4\x8A", "\xC4\xA0",
                     "\xC4\xA0"
                     "foo",
                     "\xC4\x89"
                     "bar",
                     "\xC4\xA0\xC4\xA0"}));
  EXPECT_EQ(pre_tokenize(kQwen3, "don't   stop\r\n"),
            (Strings{"don", "'t", "\xC4\xA0\xC4\xA0", "\xC4\xA0stop", "\xC4\x8D\xC4\x8A"}));
  EXPECT_EQ(pre_tokenize(kQwen3, "  x"), (Strings{"\xC4\xA0", "\xC4\xA0x"}));
}

TEST(HfComponentsPreTokenizer, Llama3DigitRuns) {
  EXPECT_EQ(pre_tokenize(kLlama3, kSample),
            (Strings{"Hello", "\xC4\xA0world", ",", "\xC4\xA0I", "'M", "\xC4\xA0here", "\xC4\xA0",
                     "123", "45", "!\xC4\x8A\xC4\x8A", "\xC4\xA0",
                     "\xC4\xA0"
                     "foo",
                     "\xC4\x89"
                     "bar",
                     "\xC4\xA0\xC4\xA0"}));
}

TEST(HfComponentsPreTokenizer, Gpt4oInvertedRemoved) {
  EXPECT_EQ(pre_tokenize(kGpt4o, kSample),
            (Strings{"Hello", "\xC4\xA0world", ",", "\xC4\xA0I'M", "\xC4\xA0here", "\xC4\xA0",
                     "123", "45", "!\xC4\x8A\xC4\x8A", "\xC4\xA0",
                     "\xC4\xA0"
                     "foo",
                     "\xC4\x89"
                     "bar",
                     "\xC4\xA0\xC4\xA0"}));
  EXPECT_EQ(pre_tokenize(kGpt4o, "don't   stop\r\n"),
            (Strings{"don't", "\xC4\xA0\xC4\xA0", "\xC4\xA0stop", "\xC4\x8D\xC4\x8A"}));
}

TEST(HfComponentsPreTokenizer, ByteLevelWithRegex) {
  const char* config =
      R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true})";
  EXPECT_EQ(pre_tokenize(config, "Hello there!"), (Strings{"\xC4\xA0Hello", "\xC4\xA0there", "!"}));
  EXPECT_EQ(pre_tokenize(config, " x"), (Strings{"\xC4\xA0x"}));
  // Every byte of a multi-byte character maps on its own: é = C3 A9 -> "Ã©".
  EXPECT_EQ(pre_tokenize(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})",
                         "\xC3\xA9"),
            (Strings{"\xC3\x83\xC2\xA9"}));
}

TEST(HfComponentsPreTokenizer, SplitBehaviors) {
  auto split = [](const char* behavior) {
    return pre_tokenize(
        std::string(R"({"type":"Split","pattern":{"String":"-"},"invert":false,"behavior":")") +
            behavior + "\"}",
        "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(HfComponentsPreTokenizer, Metaspace) {
  const char* first =
      R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":true})";
  const std::string m = "\xE2\x96\x81";
  EXPECT_EQ(pre_tokenize(first, "Hey friend"), (Strings{m + "Hey", m + "friend"}));
  EXPECT_EQ(pre_tokenize(first, "a  b"), (Strings{m + "a", m, m + "b"}));
  EXPECT_EQ(pre_tokenize(first, "Hey", /*at_start=*/false), (Strings{"Hey"}));
  const char* always =
      R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":false})";
  EXPECT_EQ(pre_tokenize(always, "Hey you", /*at_start=*/false), (Strings{m + "Hey" + m + "you"}));
  const char* never = R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"never"})";
  EXPECT_EQ(pre_tokenize(never, "Hey you"), (Strings{"Hey", m + "you"}));
  // Legacy files: "add_prefix_space": false means prepend_scheme never.
  const char* legacy = R"({"type":"Metaspace","replacement":"\u2581","add_prefix_space":false})";
  EXPECT_EQ(pre_tokenize(legacy, "Hey"), (Strings{"Hey"}));
}

TEST(HfComponentsPreTokenizer, CharacterClassSplitters) {
  EXPECT_EQ(pre_tokenize(R"({"type":"Digits","individual_digits":true})", "call 911 or 1-800"),
            (Strings{"call ", "9", "1", "1", " or ", "1", "-", "8", "0", "0"}));
  EXPECT_EQ(pre_tokenize(R"({"type":"Digits","individual_digits":false})", "call 911 or 1-800"),
            (Strings{"call ", "911", " or ", "1", "-", "800"}));
  EXPECT_EQ(pre_tokenize(R"({"type":"Whitespace"})", "Hello, world! (a_b) 3.14"),
            (Strings{"Hello", ",", "world", "!", "(", "a_b", ")", "3", ".", "14"}));
  EXPECT_EQ(pre_tokenize(R"({"type":"BertPreTokenizer"})", "Hello, world! (a_b) 3.14"),
            (Strings{"Hello", ",", "world", "!", "(", "a", "_", "b", ")", "3", ".", "14"}));
  EXPECT_EQ(pre_tokenize(R"({"type":"WhitespaceSplit"})",
                         " a\tb\xE3\x80\x80"
                         "c "),
            (Strings{"a", "b", "c"}));
  EXPECT_EQ(pre_tokenize(R"({"type":"Punctuation","behavior":"MergedWithPrevious"})", "a,b!!"),
            (Strings{"a,", "b!", "!"}));
}

TEST(HfComponentsPreTokenizer, AtStartOnlyForTheFirstSubPiece) {
  auto p = make_pre_tokenizer(
      Json::parse(R"({"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},
      {"type":"Metaspace","replacement":"_","prepend_scheme":"first"}]})"),
      kRoot);
  std::vector<Piece> pieces{Piece{"a b", true}, Piece{"c", false}};
  p->split(pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "_a");
  EXPECT_TRUE(pieces[0].at_start);
  EXPECT_EQ(pieces[1].text, "b");
  EXPECT_FALSE(pieces[1].at_start);
  EXPECT_EQ(pieces[2].text, "c");
}

TEST(HfComponentsPreTokenizer, ErrorsNameThePath) {
  EXPECT_EQ(
      error_of(
          make_pre_tokenizer,
          R"({"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"UnicodeScripts"}]})",
          "pre_tokenizer"),
      "tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported pre-tokenizer type "
      "\"UnicodeScripts\"");
  EXPECT_EQ(
      error_of(make_pre_tokenizer,
               R"({"type":"Split","pattern":{"String":"-"},"behavior":"Sideways","invert":false})",
               "pre_tokenizer"),
      "tokenizer.json: pre_tokenizer.behavior: unknown split behavior \"Sideways\"");
  EXPECT_EQ(
      error_of(make_pre_tokenizer,
               R"({"type":"Split","pattern":{"Glob":"*"},"behavior":"Isolated"})", "pre_tokenizer"),
      "tokenizer.json: pre_tokenizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}, "
      "found key \"Glob\"");
  EXPECT_EQ(
      error_of(make_pre_tokenizer, R"({"type":"Metaspace","replacement":"ab"})", "pre_tokenizer"),
      "tokenizer.json: pre_tokenizer.replacement: expected a single character, found \"ab\"");
  EXPECT_EQ(error_of(make_pre_tokenizer, R"({"kind":"Split"})", "pre_tokenizer"),
            "tokenizer.json: pre_tokenizer.type: missing or not a string");
}

// ---------------------------------------------------------------------------------------------
// Decoders

TEST(HfComponentsDecoder, ByteLevel) {
  const char* config =
      R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true})";
  EXPECT_EQ(decode(config, {"Hello", "\xC4\xA0world", "\xC4\x8A"}), "Hello world\n");
  // "é" split over two tokens ("Ã" "©") is rejoined before the UTF-8 conversion.
  EXPECT_EQ(decode(config, {"\xC3\x83", "\xC2\xA9"}), "\xC3\xA9");
  // A lone lead byte becomes U+FFFD; a token with characters outside the alphabet keeps its bytes.
  EXPECT_EQ(decode(config, {"\xC3\xA2", "x"}), "\xEF\xBF\xBDx");
  EXPECT_EQ(decode(config, {"\xE4\xBD\xA0\xC4\xA0"}), "\xE4\xBD\xA0\xC4\xA0");
}

TEST(HfComponentsDecoder, Llama2Sequence) {
  const char* config =
      R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})";
  EXPECT_EQ(decode(config, {"\xE2\x96\x81Hello", "\xE2\x96\x81wor", "ld"}), "Hello world");
  EXPECT_EQ(decode(config, {"\xE2\x96\x81", "<0xE2>", "<0x82>", "<0xAC>", "!"}), "\xE2\x82\xAC!");
}

TEST(HfComponentsDecoder, ByteFallback) {
  const char* config = R"({"type":"ByteFallback"})";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(decode(config, {"<0x41>", "<0x61>"}), "Aa");
  EXPECT_EQ(decode(config, {"<0xE2>", "<0x82>", "y", "<0xAC>"}),
            r + r + "y" + r);  // one U+FFFD per byte
  EXPECT_EQ(decode(config, {"<0xzz>", "<0x+A>"}),
            "<0xzz>\n");  // "+A" parses as Rust's from_str_radix does
}

TEST(HfComponentsDecoder, Metaspace) {
  const char* always =
      R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true})";
  EXPECT_EQ(decode(always, {"\xE2\x96\x81Hey",
                            "\xE2\x96\x81"
                            "friend!"}),
            "Hey friend!");
  const char* never =
      R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"never","split":true})";
  EXPECT_EQ(decode(never, {"\xE2\x96\x81Hey",
                           "\xE2\x96\x81"
                           "friend!"}),
            " Hey friend!");
}

TEST(HfComponentsDecoder, WordPieceStripFuse) {
  EXPECT_EQ(decode(R"({"type":"WordPiece","prefix":"##","cleanup":true})",
                   {"hello", "##world", "##s", ".", "don", "'", "t"}),
            "helloworlds. don ' t");  // " '" alone is not " ' "
  EXPECT_EQ(decode(R"({"type":"Strip","content":"x","start":2,"stop":1})", {"xxxaxx"}), "xax");
  EXPECT_EQ(decode(R"({"type":"Fuse"})", {"a", "b", "c"}), "abc");
  EXPECT_EQ(decode(R"({"type":"BPEDecoder","suffix":"</w>"})", {"a</w>", "b</w>"}), "a b");
}

TEST(HfComponentsDecoder, ErrorsNameThePath) {
  EXPECT_EQ(
      error_of(make_decoder,
               R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Unknown"}]})", "decoder"),
      "tokenizer.json: decoder.decoders[1].type: unsupported decoder type \"Unknown\"");
  EXPECT_EQ(
      error_of(make_decoder, R"({"type":"Strip","content":" ","start":-1,"stop":0})", "decoder"),
      "tokenizer.json: decoder.start: expected a non-negative integer");
  EXPECT_EQ(make_decoder(Json(nullptr), kRoot), nullptr);
}

}  // namespace
}  // namespace crl::text::hf

// Tests for BpeModel (tokenizer.json "model" of type BPE). Every expected id list below was
// produced by Hugging Face tokenizers 0.23.2 (Node binding) on a tokenizer.json holding only the
// same model, so these pin the Rust behaviour, quirks included (overlapping pairs, pending unk
// after byte fallback, the last duplicate merge winning).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "text/hf/bpe_model.h"

namespace crl::text::hf {
namespace {

using Ids = std::vector<int32_t>;

nlohmann::json bpe(nlohmann::json vocab, nlohmann::json merges,
                   nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json m = {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", std::move(vocab)},
                      {"merges", std::move(merges)}};
  for (auto it = extra.begin(); it != extra.end(); ++it) m[it.key()] = it.value();
  return m;
}

// Merges in the [["a", "b"], ...] format (a braced list alone would read as a JSON object).
nlohmann::json pairs(const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [a, b] : merges) out.push_back(nlohmann::json::array({a, b}));
  return out;
}

const JsonPath kAt{"tokenizer.json", "model"};

Ids tok(const BpeModel& model, std::string_view word) {
  Ids out;
  model.tokenize(word, out);
  return out;
}

std::string load_error(const nlohmann::json& model) {
  try {
    BpeModel m(model, kAt);
  } catch (const TokenizerFileError& e) {
    return e.what();
  }
  return "";
}

const nlohmann::json kAbcVocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};

TEST(HfBpeModelTest, AppliesTheLowestRankedMergeFirst) {
  const BpeModel m(bpe(kAbcVocab, {"a b", "b c", "ab c"}), kAt);
  EXPECT_EQ(tok(m, "abc"), (Ids{5}));
  EXPECT_EQ(tok(m, "bca"), (Ids{4, 0}));
  EXPECT_EQ(tok(m, "cab"), (Ids{2, 3}));
  EXPECT_EQ(tok(m, "abcabc"), (Ids{5, 5}));
  EXPECT_EQ(tok(m, "d"), (Ids{}));  // unknown, no unk_token: dropped
  EXPECT_EQ(tok(m, ""), (Ids{}));
  // Appends: earlier contents stay.
  Ids out{7};
  m.tokenize("abc", out);
  EXPECT_EQ(out, (Ids{7, 5}));
}

TEST(HfBpeModelTest, PairListMergesMatchStringMerges) {
  const BpeModel m(bpe(kAbcVocab, pairs({{"a", "b"}, {"b", "c"}, {"ab", "c"}})), kAt);
  EXPECT_EQ(tok(m, "abc"), (Ids{5}));
  EXPECT_EQ(tok(m, "bca"), (Ids{4, 0}));
}

TEST(HfBpeModelTest, OverlappingPairsMergeLeftmostFirst) {
  const BpeModel m1(bpe({{"a", 0}, {"aa", 1}}, {"a a"}), kAt);
  EXPECT_EQ(tok(m1, "aaa"), (Ids{1, 0}));
  EXPECT_EQ(tok(m1, "aaaa"), (Ids{1, 1}));
  EXPECT_EQ(tok(m1, "aaaaa"), (Ids{1, 1, 0}));
  const BpeModel m2(bpe({{"a", 0}, {"aa", 1}, {"aaa", 2}}, {"a a", "aa a"}), kAt);
  EXPECT_EQ(tok(m2, "aaa"), (Ids{2}));
  EXPECT_EQ(tok(m2, "aaaa"), (Ids{1, 1}));
  EXPECT_EQ(tok(m2, "aaaaa"), (Ids{1, 2}));
  EXPECT_EQ(tok(m2, "aaaaaaa"), (Ids{1, 1, 2}));
  const BpeModel m3(bpe({{"a", 0}, {"b", 1}, {"ab", 2}, {"ba", 3}}, {"b a", "a b"}), kAt);
  EXPECT_EQ(tok(m3, "aba"), (Ids{0, 3}));
  EXPECT_EQ(tok(m3, "abab"), (Ids{0, 3, 1}));
  EXPECT_EQ(tok(m3, "bab"), (Ids{3, 1}));
}

TEST(HfBpeModelTest, DuplicateMergeKeepsItsLastRankAndVersionLineIsSkipped) {
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}, {"c", 3}, {"bc", 4}};
  EXPECT_EQ(tok(BpeModel(bpe(vocab, {"a b", "b c", "a b"}), kAt), "abc"), (Ids{0, 4}));
  EXPECT_EQ(tok(BpeModel(bpe(vocab, {"#version: 0.2", "b c", "a b"}), kAt), "abc"), (Ids{0, 4}));
}

const nlohmann::json kByteVocab = {{"<unk>", 0},
                                   {"<0x0A>", 1},
                                   {"<0xC3>", 2},
                                   {"a", 3},
                                   {"<0x61>", 4},
                                   {"\xe2\x96\x81", 5},
                                   {"\xe2\x96\x81"
                                    "a",
                                    6}};

TEST(HfBpeModelTest, ByteFallbackUsesByteTokensOnlyWhenAllExist) {
  const BpeModel m(
      bpe(kByteVocab, {"\xe2\x96\x81 a"}, {{"unk_token", "<unk>"}, {"byte_fallback", true}}), kAt);
  EXPECT_EQ(tok(m, "a\n"), (Ids{3, 1}));
  EXPECT_EQ(tok(m,
                "\xe2\x96\x81"
                "a\n\xe2\x96\x81"),
            (Ids{6, 1, 5}));
  EXPECT_EQ(tok(m, "\xc3\xa9"), (Ids{0}));  // <0xA9> is missing: unk
  // A pending unk is flushed by the next known character, not by byte-fallback bytes (as in HF).
  EXPECT_EQ(tok(m, "\nx\na"), (Ids{1, 1, 0, 3}));
  EXPECT_EQ(tok(m, "x\na"), (Ids{1, 0, 3}));
  EXPECT_EQ(tok(m, "xy\na"), (Ids{0, 1, 0, 3}));
  EXPECT_EQ(tok(m, "x\xc3\xa9\nya"), (Ids{0, 1, 0, 0, 3}));
  const BpeModel fused(bpe(kByteVocab, {"\xe2\x96\x81 a"},
                           {{"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}}),
                       kAt);
  EXPECT_EQ(tok(fused, "xy\nza"), (Ids{1, 0, 3}));
  EXPECT_EQ(tok(fused, "\xc3\xa9\n"), (Ids{1, 0}));
}

TEST(HfBpeModelTest, UnknownCharactersBecomeUnkFusedOrNotOrAreDropped) {
  const nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}};
  const BpeModel unk(bpe(vocab, nlohmann::json::array(), {{"unk_token", "<unk>"}}), kAt);
  EXPECT_EQ(unk.unk_id(), 0);
  EXPECT_EQ(tok(unk, "axxa"), (Ids{1, 0, 0, 1}));
  EXPECT_EQ(tok(unk, "x"), (Ids{0}));
  EXPECT_EQ(tok(unk,
                "a\xc3\xa9"
                "a"),
            (Ids{1, 0, 1}));
  const BpeModel fused(
      bpe(vocab, nlohmann::json::array(), {{"unk_token", "<unk>"}, {"fuse_unk", true}}), kAt);
  EXPECT_EQ(tok(fused, "axxa"), (Ids{1, 0, 1}));
  EXPECT_EQ(tok(fused, "a\xc3\xa9xa"), (Ids{1, 0, 1}));
  const BpeModel none(bpe(vocab, nlohmann::json::array()), kAt);
  EXPECT_EQ(none.unk_id(), -1);
  EXPECT_EQ(tok(none, "axxa"), (Ids{1, 1}));
  EXPECT_EQ(tok(none, "x"), (Ids{}));
}

TEST(HfBpeModelTest, UnkTokenMissingFromVocabFailsOnlyWhenNeeded) {
  const BpeModel m(bpe({{"a", 1}}, nlohmann::json::array(), {{"unk_token", "<unk>"}}), kAt);
  EXPECT_EQ(m.unk_id(), -1);
  EXPECT_EQ(tok(m, "a"), (Ids{1}));
  EXPECT_THROW(tok(m, "ax"), TokenizerFileError);
}

TEST(HfBpeModelTest, IgnoreMergesTakesAWholeWordFromTheVocab) {
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"abc", 4}};
  const BpeModel plain(bpe(vocab, {"b c"}), kAt);
  EXPECT_EQ(tok(plain, "abc"), (Ids{0, 3}));
  const BpeModel ignore(bpe(vocab, {"b c"}, {{"ignore_merges", true}}), kAt);
  EXPECT_EQ(tok(ignore, "abc"), (Ids{4}));
  EXPECT_EQ(tok(ignore, "bca"), (Ids{3, 0}));
}

TEST(HfBpeModelTest, ContinuingSubwordPrefixAndEndOfWordSuffix) {
  const BpeModel prefix(
      bpe({{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}, {"abc", 4}, {"##a", 5}, {"b", 6}},
          {"a ##b", "ab ##c"}, {{"continuing_subword_prefix", "##"}}),
      kAt);
  EXPECT_EQ(tok(prefix, "abc"), (Ids{4}));
  EXPECT_EQ(tok(prefix, "ab"), (Ids{3}));
  EXPECT_EQ(tok(prefix, "ba"), (Ids{6, 5}));
  EXPECT_EQ(tok(prefix, "bab"), (Ids{6, 5, 1}));
  EXPECT_EQ(tok(prefix, "aa"), (Ids{0, 5}));
  const BpeModel suffix(
      bpe({{"a", 0}, {"b", 1}, {"b</w>", 2}, {"ab</w>", 3}, {"a</w>", 4}, {"ab", 5}},
          {"a b</w>", "a b"}, {{"end_of_word_suffix", "</w>"}}),
      kAt);
  EXPECT_EQ(tok(suffix, "ab"), (Ids{3}));
  EXPECT_EQ(tok(suffix, "abab"), (Ids{5, 3}));
  EXPECT_EQ(tok(suffix, "ba"), (Ids{1, 4}));
  EXPECT_EQ(tok(suffix, "b"), (Ids{2}));
  const BpeModel both(
      bpe({{"a", 0}, {"##b</w>", 1}, {"ab</w>", 2}, {"##b", 3}, {"ab", 4}}, {"a ##b</w>", "a ##b"},
          {{"continuing_subword_prefix", "##"}, {"end_of_word_suffix", "</w>"}}),
      kAt);
  EXPECT_EQ(tok(both, "ab"), (Ids{2}));
  EXPECT_EQ(tok(both, "abb"), (Ids{4, 1}));
  EXPECT_EQ(tok(both, "a"), (Ids{}));  // "a</w>" is not in the vocab
}

TEST(HfBpeModelTest, VocabLookups) {
  const BpeModel m(
      bpe({{"a", 5}, {"b", 9}, {"<unk>", 2}}, nlohmann::json::array(), {{"unk_token", "<unk>"}}),
      kAt);
  EXPECT_EQ(m.vocab_size(), 10);
  EXPECT_EQ(m.unk_id(), 2);
  EXPECT_EQ(m.token_to_id("b"), 9);
  EXPECT_EQ(m.token_to_id("c"), -1);
  ASSERT_NE(m.id_to_token(5), nullptr);
  EXPECT_EQ(*m.id_to_token(5), "a");
  EXPECT_EQ(m.id_to_token(6), nullptr);
  EXPECT_EQ(m.id_to_token(10), nullptr);
  EXPECT_EQ(m.id_to_token(-1), nullptr);
  EXPECT_EQ(tok(m, "ab"), (Ids{5, 9}));
}

TEST(HfBpeModelTest, MalformedModelsFailNamingThePath) {
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  std::string e = load_error(bpe(vocab, {"a b", "a x"}));
  EXPECT_NE(e.find("model.merges[1]"), std::string::npos) << e;
  EXPECT_NE(e.find("\"x\""), std::string::npos) << e;
  e = load_error(bpe({{"a", 0}, {"b", 1}}, {"a b"}));  // merged "ab" missing
  EXPECT_NE(e.find("model.merges[0]"), std::string::npos) << e;
  e = load_error(bpe(vocab, pairs({{"a", "b"}, {"a", "x"}})));
  EXPECT_NE(e.find("model.merges[1]"), std::string::npos) << e;
  e = load_error(bpe(vocab, {"a b c"}));
  EXPECT_NE(e.find("model.merges[0]"), std::string::npos) << e;
  e = load_error(
      bpe(vocab,
          nlohmann::json::array(
              {"a b", nlohmann::json::array({"a", "b"})})));  // mixed formats (HF rejects them too)
  EXPECT_NE(e.find("model.merges[1]"), std::string::npos) << e;
  e = load_error(bpe(vocab, {"a b"}, {{"type", "WordPiece"}}));
  EXPECT_NE(e.find("WordPiece"), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.json: model.type"), std::string::npos) << e;
  e = load_error(bpe(vocab, {"a b"}, {{"dropout", 0.1}}));
  EXPECT_NE(e.find("model.dropout"), std::string::npos) << e;
  e = load_error(bpe({{"a", -1}}, nlohmann::json::array()));
  EXPECT_NE(e.find("model.vocab.a"), std::string::npos) << e;
  e = load_error(bpe(vocab, nlohmann::json::object()));
  EXPECT_NE(e.find("model.merges"), std::string::npos) << e;
  // dropout 0 is deterministic and fine; so is a legacy model without "type".
  EXPECT_EQ(load_error(bpe(vocab, {"a b"}, {{"dropout", 0.0}})), "");
  nlohmann::json legacy = bpe(vocab, {"a b"});
  legacy.erase("type");
  EXPECT_EQ(tok(BpeModel(legacy, kAt), "ab"), (Ids{2}));
}

TEST(HfBpeModelTest, ConcurrentTokenizeGivesTheSameIds) {
  // Letters a..e with every pair merged, in a fixed pseudo-random rank order.
  nlohmann::json vocab = nlohmann::json::object();
  std::vector<std::string> merge_list;
  const std::string letters = "abcde";
  int id = 0;
  for (char c : letters) vocab[std::string(1, c)] = id++;
  for (char x : letters) {
    for (char y : letters) {
      vocab[std::string{x, y}] = id++;
      merge_list.push_back(std::string{x, ' ', y});
    }
  }
  std::mt19937 rng(7);
  std::shuffle(merge_list.begin(), merge_list.end(), rng);
  const nlohmann::json model = bpe(vocab, merge_list);
  std::vector<std::string> words;
  for (int i = 0; i < 4000; ++i) {
    std::string w(1 + rng() % (i % 10 == 0 ? 400 : 12), 'a');  // some too long to cache
    for (char& c : w) c = letters[rng() % letters.size()];
    words.push_back(w);
  }
  std::vector<Ids> expected;
  {
    const BpeModel reference(model, kAt);
    for (const auto& w : words) expected.push_back(tok(reference, w));
  }
  const BpeModel shared(model, kAt);
  constexpr int kThreads = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < words.size(); ++i) {
          const size_t k = (i * (t + 1) + round) % words.size();
          if (tok(shared, words[k]) != expected[k]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace crl::text::hf

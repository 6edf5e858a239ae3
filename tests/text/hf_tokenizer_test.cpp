// The tokenizer.json pipeline end to end on a small hand-written file: added tokens (special and
// not; lstrip/rstrip, single_word, normalized), the post-processor and tokenizer_config.json's
// add_bos_token/add_eos_token, split_special_tokens, decode, the facade's choice of file, and
// errors that name the file and the JSON path. Expected ids come from Hugging Face's tokenizers
// 0.23.2 (Node binding) on the same file; the six real tokenizers are in
// hf_tokenizer_conformance_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"
#include "tests/test_utils.h"
#include "text/tokenizer.h"

namespace crl::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// Vocab a b c Ġ ab Ġa Ġab < > x s e o t l (ids 0-14); added <s> 15 (special), <eot> 16 (special,
// lstrip + rstrip), xx 17 (single_word, normalized), <tool> 18; ByteLevel; BOS template.
const char* kTokenizerJson =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [{"id": 15, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 16, "content": "<eot>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": true}, {"id": 17, "content": "xx", "single_word": true, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 18, "content": "<tool>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}], "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [15], "tokens": ["<s>"]}}}, "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "\u0120a": 5, "\u0120ab": 6, "<": 7, ">": 8, "x": 9, "s": 10, "e": 11, "o": 12, "t": 13, "l": 14}, "merges": ["a b", "\u0120 a", "\u0120a b"]}})JSON";

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { write(dir_.file("tokenizer.json"), kTokenizerJson); }
  test::TempDir dir_;
};

TEST_F(HfTokenizerTest, MatchesHuggingFaceOnAddedTokensAndTemplate) {
  const Tokenizer tok(dir_.path());
  EXPECT_EQ(tok.kind(), "tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 19);
  EncodeOptions with;
  with.add_special_tokens = true;
  // {text, ids, ids with special tokens}: from tokenizers 0.23.2.
  const std::vector<std::tuple<std::string, Ids, Ids>> cases = {
      {"xx", {17}, {15, 17}},
      {"axx", {0, 9, 9}, {15, 0, 9, 9}},  // single_word: "xx" inside a word is not the token
      {"xx c", {17, 3, 2}, {15, 17, 3, 2}},
      {"a  <eot>  b", {0, 16, 1}, {15, 0, 16, 1}},  // lstrip and rstrip take the spaces
      {"c<s>ab", {2, 15, 4}, {15, 2, 15, 4}},
      {" ab<tool>x", {3, 4, 18, 9}, {15, 3, 4, 18, 9}},
      {"xxxx", {9, 9, 9, 9}, {15, 9, 9, 9, 9}},
      {"", {}, {15}},
      {"a\xC3\xA9"
       "b",
       {4},
       {15, 4}},  // no byte in the vocab for é: dropped, as HF does
      {"x xx.", {9, 3, 17}, {15, 9, 3, 17}},
  };
  for (const auto& [text, ids, ids_special] : cases) {
    EXPECT_EQ(tok.encode(text), ids) << text;
    EXPECT_EQ(tok.encode(text, with), ids_special) << text;
  }
  EXPECT_EQ(tok.decode({15, 0, 16, 1}, /*skip_special_tokens=*/false), "<s>a<eot>b");
  EXPECT_EQ(tok.decode({15, 0, 16, 1}, /*skip_special_tokens=*/true), "ab");
  EXPECT_EQ(tok.decode({15, 3, 4, 18, 9}, true), " ab<tool>x");  // <tool> is not special
  EXPECT_TRUE(tok.is_special(15));
  EXPECT_FALSE(tok.is_special(18));
  EXPECT_EQ(tok.id_to_piece(3), "\xC4\xA0");  // Ġ
  EXPECT_EQ(tok.piece_to_id("<eot>"), 16);
  EXPECT_EQ(tok.piece_to_id("nope"), -1);
  ASSERT_THROWS_WITH(tok.decode({19}), std::invalid_argument, "token id 19 is out of range");
  // No tokenizer_config.json: no bos/eos known.
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.eos_id(), -1);
}

TEST_F(HfTokenizerTest, SplitSpecialTokensSpellsThemOut) {
  const Tokenizer tok(dir_.path());
  EncodeOptions untrusted;
  untrusted.split_special_tokens = true;
  EXPECT_EQ(tok.encode("c<s>ab", untrusted), (Ids{2, 7, 10, 8, 4}));
  // Added tokens that are not special are still found.
  EXPECT_EQ(tok.encode(" ab<tool>x", untrusted), (Ids{3, 4, 18, 9}));
}

TEST_F(HfTokenizerTest, TokenizerConfigSuppliesSpecialTokensAndAddFlags) {
  write(dir_.file("tokenizer_config.json"),
        R"({"bos_token": "<s>", "eos_token": {"content": "<eot>"}, "pad_token": null,
            "add_bos_token": false, "add_eos_token": true})");
  const Tokenizer tok(dir_.path());
  EXPECT_EQ(tok.bos_id(), 15);
  EXPECT_EQ(tok.eos_id(), 16);
  EXPECT_EQ(tok.pad_id(), -1);
  EncodeOptions with;
  with.add_special_tokens = true;
  // transformers rebuilds the post-processor from the flags: no BOS, EOS after.
  EXPECT_EQ(tok.encode("xx", with), (Ids{17, 16}));
}

TEST_F(HfTokenizerTest, TokenizerJsonIsPreferredOverTokenizerModel) {
  std::filesystem::copy_file(engine::ensure_default_tokenizer(), dir_.file("tokenizer.model"));
  EXPECT_EQ(Tokenizer::tokenizer_file_in(dir_.path()), dir_.file("tokenizer.json"));
  EXPECT_EQ(Tokenizer(dir_.path()).kind(), "tokenizer.json");
  EXPECT_EQ(Tokenizer(dir_.file("tokenizer.model")).kind(), "sentencepiece");
  test::TempDir empty;
  EXPECT_FALSE(Tokenizer::dir_has_tokenizer(empty.path()));
  ASSERT_THROWS_WITH(Tokenizer{empty.path()}, std::runtime_error, "no tokenizer in");
}

// Each malformed file is an error naming the file and the JSON path; nothing crashes.
TEST_F(HfTokenizerTest, MalformedFilesNameTheFileAndJsonPath) {
  const json good = json::parse(kTokenizerJson);
  auto expect_error = [&](const std::function<void(json&)>& spoil, const std::string& want) {
    json j = good;
    spoil(j);
    write(dir_.file("tokenizer.json"), j.dump());
    ASSERT_THROWS_WITH(Tokenizer{dir_.path()}, std::runtime_error, want);
    ASSERT_THROWS_WITH(Tokenizer{dir_.path()}, std::runtime_error, dir_.file("tokenizer.json"));
  };
  expect_error([](json& j) { j.erase("model"); }, "tokenizer.json: model: missing");
  expect_error([](json& j) { j["model"]["type"] = "WordPiece"; },
               "model.type: unsupported model type \"WordPiece\"");
  expect_error([](json& j) { j["model"]["merges"].push_back("a zz"); }, "model.merges[3]");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"},
                              {"pattern", {{"Regex", "(unclosed"}}},
                              {"behavior", "Isolated"},
                              {"invert", false}};
      },
      "pre_tokenizer.pattern");
  expect_error([](json& j) { j["pre_tokenizer"]["type"] = "UnicodeScripts"; },
               "pre_tokenizer.type: unsupported pre-tokenizer type \"UnicodeScripts\"");
  expect_error([](json& j) { j["post_processor"]["type"] = "Mystery"; },
               "post_processor.type: unsupported post-processor type \"Mystery\"");
  expect_error([](json& j) { j["added_tokens"][1].erase("content"); }, "added_tokens[1].content");
  expect_error([](json& j) { j["decoder"] = {{"type", "Nope"}}; }, "decoder.type");
  write(dir_.file("tokenizer.json"), "{\"model\": ");
  ASSERT_THROWS_WITH(Tokenizer{dir_.path()}, std::runtime_error, "not valid JSON");

  write(dir_.file("tokenizer.json"), kTokenizerJson);
  write(dir_.file("tokenizer_config.json"), R"({"bos_token": "<nope>"})");
  ASSERT_THROWS_WITH(Tokenizer{dir_.path()}, std::runtime_error,
                     "tokenizer_config.json: bos_token: token \"<nope>\" is not in the vocabulary");
}

TEST_F(HfTokenizerTest, SpecialTokensMapFillsInAndMissingPiecesAreLenient) {
  EncodeOptions with;
  with.add_special_tokens = true;
  // add_bos_token with no bos_token anywhere: off, as in transformers (the template goes too).
  write(dir_.file("tokenizer_config.json"), R"({"add_bos_token": true})");
  EXPECT_EQ(Tokenizer(dir_.path()).encode("xx", with), (Ids{17}));
  EXPECT_TRUE(Tokenizer(dir_.path()).special_prefix().empty());
  // special_tokens_map.json names what tokenizer_config.json does not; an unknown pad is none.
  write(dir_.file("special_tokens_map.json"),
        R"({"bos_token": {"content": "<s>"}, "eos_token": "<eot>", "pad_token": "<pad>"})");
  const Tokenizer tok(dir_.path());
  EXPECT_EQ(tok.bos_id(), 15);
  EXPECT_EQ(tok.eos_id(), 16);
  EXPECT_EQ(tok.pad_id(), -1);
  EXPECT_EQ(tok.encode("xx", with), (Ids{15, 17}));
  EXPECT_EQ(tok.special_prefix(), (Ids{15}));
}

// A real tokenizer directory is copied as it is, even where its config and tokenizer disagree
// about BOS the way Qwen's do (config bos_token_id set, tokenizer bos_token null): checkpoints of
// such a model must save.
TEST_F(HfTokenizerTest, ModelDirectoryCopiesARealTokenizerAsItIs) {
  write(dir_.file("tokenizer_config.json"),
        R"({"eos_token": "<eot>", "chat_template": "{{ 1 }}"})");
  write(dir_.file("generation_config.json"), R"({"eos_token_id": 16, "temperature": 0.7})");
  engine::ModelConfig c = engine::preset_config("default");
  ASSERT_GE(c.bos_token_id, 0);  // a BOS id the tokenizer does not have
  test::TempDir out;
  engine::write_model_dir(out.file("m"), c, engine::random_init_weights(c, 1, at::kFloat),
                          dir_.path());
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    std::ifstream a(dir_.file(name)), b(out.file("m") + "/" + name);
    std::stringstream sa, sb;
    sa << a.rdbuf();
    sb << b.rdbuf();
    EXPECT_EQ(sa.str(), sb.str()) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(out.file("m") + "/tokenizer.model"));
  EXPECT_EQ(Tokenizer(out.file("m")).eos_id(), 16);
}

}  // namespace
}  // namespace crl::text

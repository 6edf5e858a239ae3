#include "engine/model/model_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/test_utils.h"
#include "text/tokenizer.h"

namespace crl::engine {
namespace {

using nlohmann::json;

ModelConfig small_config(const std::string& model_type) {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = 400;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.attention_bias = model_type == "qwen2";
  c.bos_token_id = 2;
  c.eos_token_ids = {3};
  c.max_position_embeddings = 512;
  return c;
}

double stddev(const at::Tensor& t) { return t.to(at::kDouble).std().item<double>(); }

TEST(ModelWriterTest, RandomInitIsDeterministicAndIgnoresGlobalRng) {
  const ModelConfig c = small_config("qwen2");
  at::manual_seed(1);
  const NamedTensors a = random_init_weights(c, 42, at::kFloat);
  at::manual_seed(2);
  at::randn({100});
  const NamedTensors b = random_init_weights(c, 42, at::kFloat);
  const NamedTensors other = random_init_weights(c, 43, at::kFloat);
  const auto specs = model_param_specs(c);
  ASSERT_EQ(a.size(), specs.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, specs[i].name);
    EXPECT_EQ(a[i].second.sizes().vec(), specs[i].shape);
    test::expect_tensor_equal(a[i].second, b[i].second);
  }
  EXPECT_FALSE(at::equal(a[0].second, other[0].second));

  std::map<std::string, at::Tensor> w(a.begin(), a.end());
  test::expect_tensor_equal(w.at("model.norm.weight"), at::ones({64}));
  test::expect_tensor_equal(w.at("model.layers.1.input_layernorm.weight"), at::ones({64}));
  test::expect_tensor_equal(w.at("model.layers.0.self_attn.k_proj.bias"), at::zeros({32}));
  EXPECT_NEAR(stddev(w.at("model.embed_tokens.weight")), 0.02, 0.001);  // 25600 samples
  EXPECT_NEAR(stddev(w.at("lm_head.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(w.at("model.layers.0.mlp.down_proj.weight")), 0.01, 0.0008);  // / sqrt(2*2)
  EXPECT_NEAR(w.at("model.layers.0.self_attn.q_proj.weight").mean().item<double>(), 0.0, 0.002);

  const NamedTensors bf16 = random_init_weights(c, 42, at::kBFloat16);
  EXPECT_EQ(bf16[0].second.scalar_type(), at::kBFloat16);
  test::expect_tensor_equal(bf16[0].second, a[0].second.to(at::kBFloat16));
}

TEST(ModelWriterTest, DefaultCorpusIsDeterministicAndItsArithmeticIsCorrect) {
  const std::string text = default_corpus_text();
  EXPECT_EQ(text, default_corpus_text());
  EXPECT_GT(text.size(), 100u * 1024);
  EXPECT_LT(text.size(), 300u * 1024);
  std::istringstream lines(text);
  std::string line;
  int checked = 0, questions = 0;
  while (std::getline(lines, line)) {
    long a = 0, b = 0, c = 0;
    char op = 0;
    char word[16] = {0};
    if (std::sscanf(line.c_str(), "%ld %c %ld = %ld", &a, &op, &b, &c) == 4) {
      const long expected = op == '+' ? a + b : op == '-' ? a - b : a * b;
      EXPECT_EQ(c, expected) << line;
      ++checked;
    } else if (std::sscanf(line.c_str(), "Question: what is %ld %15s %ld? Answer: %ld", &a, word,
                           &b, &c) == 4) {
      const std::string w(word);
      const long expected = w == "plus" ? a + b : w == "minus" ? a - b : a * b;
      EXPECT_EQ(c, expected) << line;
      ++questions;
    }
  }
  EXPECT_GT(checked, 500);
  EXPECT_GT(questions, 500);
}

TEST(ModelWriterTest, WritesDirectoryThatLoadsBack) {
  test::TempDir work;
  std::ofstream(work.file("corpus.txt"), std::ios::binary) << default_corpus_text();
  text::Tokenizer::train(work.file("corpus.txt"), work.file("tok"), 400);
  const ModelConfig c = small_config("llama");
  const NamedTensors weights = random_init_weights(c, 7, at::kBFloat16);
  const std::string dir = work.file("model/nested");
  write_model_dir(dir, c, weights, work.file("tok.model"));

  const ModelConfig back = load_model_config(dir);
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(back.bos_token_id, 2);
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{3}));
  const NamedTensors loaded = load_checkpoint(dir, model_param_specs(back), at::kBFloat16);
  ASSERT_EQ(loaded.size(), weights.size());
  for (size_t i = 0; i < loaded.size(); ++i)
    test::expect_tensor_equal(loaded[i].second, weights[i].second);

  const text::Tokenizer tok(dir + "/tokenizer.model");
  EXPECT_EQ(tok.vocab_size(), 400);
  std::ifstream tc_in(dir + "/tokenizer_config.json");
  const json tc = json::parse(tc_in);
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["eos_token"], "</s>");
  EXPECT_EQ(tc["pad_token"], "<pad>");
  EXPECT_EQ(tc["unk_token"], "<unk>");
  EXPECT_EQ(tc["model_max_length"], 512);
  std::ifstream gc_in(dir + "/generation_config.json");
  EXPECT_EQ(json::parse(gc_in)["eos_token_id"], 3);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }

  // Inconsistent inputs are refused before anything is written.
  NamedTensors missing(weights.begin(), weights.end() - 1);
  ASSERT_THROWS_WITH(write_model_dir(work.file("m2"), c, missing, work.file("tok.model")),
                     std::invalid_argument, "'lm_head.weight' is missing");
  ModelConfig small_vocab = c;
  small_vocab.vocab_size = 300;
  ASSERT_THROWS_WITH(
      write_model_dir(work.file("m2"), small_vocab, random_init_weights(small_vocab, 1, at::kFloat),
                      work.file("tok.model")),
      std::invalid_argument, "vocab_size");
  ModelConfig wrong_bos = c;
  wrong_bos.bos_token_id = 5;
  ASSERT_THROWS_WITH(write_model_dir(work.file("m2"), wrong_bos, weights, work.file("tok.model")),
                     std::invalid_argument, "bos");
  EXPECT_FALSE(std::filesystem::exists(work.file("m2")));
}

}  // namespace
}  // namespace crl::engine

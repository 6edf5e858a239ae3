#include "engine/model/weight_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/model/safetensors.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ModelConfig tiny_config(const std::string& model_type = "llama", bool tied = false) {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.attention_bias = model_type == "qwen2";
  c.tie_word_embeddings = tied;
  c.validate();
  return c;
}

NamedTensors make_weights(const std::vector<ParamSpec>& specs, uint64_t seed = 1) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  NamedTensors out;
  for (const auto& s : specs) out.emplace_back(s.name, at::randn(s.shape, gen));
  return out;
}

void expect_same(const NamedTensors& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    test::expect_tensor_equal(got[i].second, want[i].second);
  }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(WeightLoaderTest, LoadsSingleFileCheckpointInSpecOrder) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  const NamedTensors weights = make_weights(specs);
  NamedTensors shuffled(weights.rbegin(), weights.rend());  // file order must not matter
  save_checkpoint(dir.path(), shuffled);
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors")));
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  expect_same(load_checkpoint(dir.path(), specs, at::kFloat), weights);
}

TEST(WeightLoaderTest, SavesAndLoadsCheckpointShardedAcrossTwoFiles) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  const NamedTensors weights = make_weights(specs);
  int64_t total = 0;
  for (const auto& [name, t] : weights) total += t.numel() * 4;
  save_checkpoint(dir.path(), weights, total * 6 / 10);

  const json index = read_json(dir.file("model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_EQ(shards, (std::set<std::string>{"model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(index["weight_map"].size(), specs.size());
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  for (const auto& s : shards) {
    EXPECT_EQ(SafetensorsFile::open(dir.file(s))->metadata().at("format"), "pt");
  }
  expect_same(load_checkpoint(dir.path(), specs, at::kFloat), weights);

  // Saving unsharded over it removes the index, so the new single file is what loads.
  const NamedTensors other = make_weights(specs, 2);
  save_checkpoint(dir.path(), other);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  expect_same(load_checkpoint(dir.path(), specs, at::kFloat), other);
}

TEST(WeightLoaderTest, ReadsHandWrittenIndexWithArbitraryShardNames) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  const NamedTensors weights = make_weights(specs);
  NamedTensors head(weights.begin(), weights.begin() + 3), rest(weights.begin() + 3, weights.end());
  write_safetensors(dir.file("part-a.safetensors"), head);
  write_safetensors(dir.file("part-b.safetensors"), rest);
  json map = json::object();
  for (const auto& kv : head) map[kv.first] = "part-a.safetensors";
  for (const auto& kv : rest) map[kv.first] = "part-b.safetensors";
  std::ofstream(dir.file("model.safetensors.index.json")) << json{{"weight_map", map}}.dump();
  expect_same(load_checkpoint(dir.path(), specs, at::kFloat), weights);
}

TEST(WeightLoaderTest, LoadsBf16CheckpointAsFloatWithBf16Rounding) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  const NamedTensors weights = make_weights(specs);
  NamedTensors bf16;
  for (const auto& [name, t] : weights) bf16.emplace_back(name, t.to(at::kBFloat16));
  save_checkpoint(dir.path(), bf16);
  EXPECT_EQ(
      SafetensorsFile::open(dir.file("model.safetensors"))->tensors().at("model.norm.weight").dtype,
      "BF16");
  const NamedTensors loaded = load_checkpoint(dir.path(), specs, at::kFloat);
  ASSERT_EQ(loaded.size(), weights.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_EQ(loaded[i].second.scalar_type(), at::kFloat);
    test::expect_tensor_equal(loaded[i].second, weights[i].second.to(at::kBFloat16).to(at::kFloat));
    // bf16 keeps 8 mantissa bits: within 2^-8 relative, but not exact.
    test::expect_tensor_near(loaded[i].second, weights[i].second, 0.0, 1.0 / 256);
  }
  EXPECT_FALSE(at::equal(loaded[0].second, weights[0].second));
}

TEST(WeightLoaderTest, TiedModelNeedsNoLmHeadAndIgnoresOne) {
  test::TempDir dir;
  const auto tied_specs = model_param_specs(tiny_config("llama", /*tied=*/true));
  const NamedTensors tied = make_weights(tied_specs);
  save_checkpoint(dir.path(), tied);
  expect_same(load_checkpoint(dir.path(), tied_specs, at::kFloat), tied);

  // An untied checkpoint (with lm_head.weight) also loads into the tied model.
  const NamedTensors untied = make_weights(model_param_specs(tiny_config()));
  save_checkpoint(dir.path(), untied);
  const NamedTensors loaded = load_checkpoint(dir.path(), tied_specs, at::kFloat);
  EXPECT_EQ(loaded.size(), tied_specs.size());
  EXPECT_EQ(loaded.back().first, "model.norm.weight");
}

TEST(WeightLoaderTest, Qwen2BiasesLoadWhenPresentAndAreReportedWhenMissing) {
  test::TempDir dir;
  const auto qwen_specs = model_param_specs(tiny_config("qwen2"));
  const NamedTensors qwen = make_weights(qwen_specs);
  save_checkpoint(dir.path(), qwen);
  const NamedTensors loaded = load_checkpoint(dir.path(), qwen_specs, at::kFloat);
  expect_same(loaded, qwen);
  EXPECT_EQ(loaded[3].first, "model.layers.0.self_attn.q_proj.bias");

  save_checkpoint(dir.path(), make_weights(model_param_specs(tiny_config("llama"))));
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), qwen_specs, at::kFloat), std::runtime_error,
                     "missing tensor 'model.layers.0.self_attn.q_proj.bias' (searched " +
                         dir.file("model.safetensors"));
}

TEST(WeightLoaderTest, ReportsShapeMismatchWithFileAndBothShapes) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  NamedTensors weights = make_weights(specs);
  ASSERT_EQ(weights[2].first, "model.layers.0.self_attn.q_proj.weight");
  weights[2].second = at::zeros({16, 8});
  save_checkpoint(dir.path(), weights);
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "tensor 'model.layers.0.self_attn.q_proj.weight' in " +
                         dir.file("model.safetensors") + " has shape [16, 8], expected [16, 16]");
}

// Issue 49: NaN or infinite weights, and a config.json with fewer layers than the weights, loaded
// silently (generate exited 0). Both are errors naming the tensor or the layer count, in a single
// file and in shards; bf16 checked in place.
TEST(WeightLoaderTest, ReportsNonFiniteWeightsAndLayersPastTheConfig) {
  const auto specs = model_param_specs(tiny_config());
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(std::string(dtype == at::kFloat ? "float " : "bfloat16 ") +
                   (std::isnan(bad) ? "NaN" : "inf"));
      test::TempDir dir;
      NamedTensors weights = make_weights(specs);
      weights[3].second.view(-1)[5] = bad;
      save_checkpoint(dir.path(), weights);
      ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, dtype), std::runtime_error,
                         "tensor '" + weights[3].first + "' in " + dir.file("model.safetensors") +
                             " holds " + (std::isnan(bad) ? "NaN" : "infinite") +
                             " values (the first at element 5)");
    }
  }
  // Weights of 4 layers under a config of 2.
  ModelConfig four = tiny_config();
  four.num_layers = 4;
  for (int64_t shard_bytes : {int64_t{0}, int64_t{4096}}) {
    SCOPED_TRACE(shard_bytes == 0 ? "one file" : "shards");
    test::TempDir dir;
    save_checkpoint(dir.path(), make_weights(model_param_specs(four)), shard_bytes);
    ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                       "has weights of 4 layers (e.g. 'model.layers.3.");
    ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                       "but config.json's num_hidden_layers is 2");
  }
}

TEST(WeightLoaderTest, ReportsMissingTensorsShardsAndCheckpoints) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "no checkpoint in directory " + dir.path());

  NamedTensors weights = make_weights(specs);
  save_checkpoint(dir.path(), weights, 4096);
  const json index = read_json(dir.file("model.safetensors.index.json"));
  const std::string last_shard = index["weight_map"]["lm_head.weight"];

  // A tensor the index does not list.
  json trimmed = index;
  trimmed["weight_map"].erase("model.norm.weight");
  std::ofstream(dir.file("model.safetensors.index.json")) << trimmed.dump();
  ASSERT_THROWS_WITH(
      load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
      "missing tensor 'model.norm.weight': not in " + dir.file("model.safetensors.index.json"));

  // An index entry pointing at a shard that lacks the tensor.
  json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = wrong["weight_map"]["model.embed_tokens.weight"];
  std::ofstream(dir.file("model.safetensors.index.json")) << wrong.dump();
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "missing tensor 'model.norm.weight'");

  // A shard that does not exist.
  std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
  fs::remove(dir.file(last_shard));
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "names shard " + dir.file(last_shard));

  // A corrupt index.
  std::ofstream(dir.file("model.safetensors.index.json")) << "{\"weight_map\": [";
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     dir.file("model.safetensors.index.json"));
  std::ofstream(dir.file("model.safetensors.index.json")) << "{\"weight_map\": {\"a\": \"../x\"}}";
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "not a plain file name");
}

TEST(WeightLoaderTest, ReportsCorruptShardAndUnconvertibleDtype) {
  test::TempDir dir;
  const auto specs = model_param_specs(tiny_config());
  NamedTensors weights = make_weights(specs);
  weights.back().second = weights.back().second.to(at::kInt);
  save_checkpoint(dir.path(), weights);
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     "tensor 'lm_head.weight'");

  std::ofstream(dir.file("model.safetensors"), std::ios::binary | std::ios::trunc) << "garbage!!";
  ASSERT_THROWS_WITH(load_checkpoint(dir.path(), specs, at::kFloat), std::runtime_error,
                     dir.file("model.safetensors"));
}

// A sharded reader (a ZeRO-3 rank) takes element ranges: the same bits as the whole tensor's, in
// shards too, only what it asked for counted as read, and a NaN found in a range named by its
// element in the whole tensor. The structure is checked when the reader opens, before any read.
TEST(WeightLoaderTest, ReaderTakesElementRangesWithTheWholeLoadsBitsAndChecks) {
  const auto specs = model_param_specs(tiny_config());
  NamedTensors weights = make_weights(specs);
  weights[2].second.view(-1)[40] = std::nanf("");
  for (int64_t shard_bytes : {int64_t{0}, int64_t{4096}}) {
    SCOPED_TRACE(shard_bytes == 0 ? "one file" : "shards");
    test::TempDir dir;
    save_checkpoint(dir.path(), weights, shard_bytes);
    const CheckpointReader reader(dir.path(), specs);
    EXPECT_EQ(reader.elements_read(), 0);
    int64_t asked = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (i == 2) continue;
      const at::Tensor whole = weights[i].second.reshape({-1});
      const int64_t n = whole.numel(), from = n / 3, count = n / 2;
      test::expect_tensor_equal(reader.load_range(i, from, count, at::kFloat),
                                whole.narrow(0, from, count));
      test::expect_tensor_equal(reader.load_range(i, 0, 0, at::kFloat), whole.narrow(0, 0, 0));
      asked += count;
    }
    EXPECT_EQ(reader.elements_read(), asked);
    test::expect_tensor_equal(reader.load_range(2, 0, 40, at::kFloat),
                              weights[2].second.reshape({-1}).narrow(0, 0, 40));
    ASSERT_THROWS_WITH(reader.load_range(2, 30, 20, at::kBFloat16), std::runtime_error,
                       "tensor '" + weights[2].first + "' in ");
    ASSERT_THROWS_WITH(reader.load_range(2, 30, 20, at::kFloat), std::runtime_error,
                       "holds NaN values (the first at element 40)");
    ASSERT_THROWS_WITH(reader.load(2, at::kFloat), std::runtime_error,
                       "holds NaN values (the first at element 40)");
  }
  ModelConfig four = tiny_config();
  four.num_layers = 4;
  test::TempDir dir;
  save_checkpoint(dir.path(), make_weights(model_param_specs(four)));
  ASSERT_THROWS_WITH(CheckpointReader(dir.path(), specs), std::runtime_error,
                     "has weights of 4 layers");
}

}  // namespace
}  // namespace crl::engine

// Merged projections (TransformerOptions::merge_projections): q/k/v and gate/up as one product each
// give the five products' tokens and log-probs, a layer whose group lies apart in memory runs them
// apart, and a weight update written into the sync buckets reaches the merged products.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"
#include "engine/model/transformer.h"
#include "engine/weight_buffers.h"
#include "tests/engine/engine_requests.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

const std::vector<int32_t> kPrompt = {5, 17, 99, 250, 31, 8, 77, 140, 2, 64, 33, 12, 400, 7};

std::vector<GenerateRequest> requests() {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    GenerateRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids.assign(kPrompt.begin(), kPrompt.begin() + 6 + 4 * i);
    r.params.temperature = i == 2 ? 1.0 : 0.0;  // two greedy rows, one seeded
    r.params.seed = 7;
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(MergedProjectionsTest, EnginesGiveTheFiveProductsTokensOnEveryModelVariant) {
  for (const std::string variant : {"llama", "qwen2", "qwen3", "llama3"}) {
    SCOPED_TRACE(variant);
    EngineConfig cfg = test::test_engine_config(variant);
    LlmEngine apart(cfg);  // the default: five products a layer
    cfg.merge_projections = true;
    LlmEngine merged(cfg);
    EXPECT_EQ(apart.model().merged_layers(), 0);
    EXPECT_EQ(merged.model().merged_layers(), merged.model_config().num_layers);
    test::expect_same_outputs(merged.generate(requests()), apart.generate(requests()), 1e-4);
  }
}

TEST(MergedProjectionsTest, ALayerWhoseWeightIsReplacedApartRunsFiveProductsAndTheRestStayMerged) {
  TransformerOptions opts;
  opts.merge_projections = true;
  Transformer merged = Transformer::load(test::test_model_dir("qwen2"), opts);
  Transformer apart = Transformer::load(test::test_model_dir("qwen2"), TransformerOptions{});
  const int64_t layers = merged.config().num_layers;
  ASSERT_EQ(merged.merged_layers(), layers);
  const std::string name = "model.layers.1.self_attn.k_proj.bias";
  at::Tensor k_bias;
  for (const auto& [n, t] : merged.named_parameters()) {
    if (n == name) k_bias = t.clone() + 0.5;
  }
  merged.set_parameter(name, k_bias);  // a tensor of its own: layer 1's q/k/v biases lie apart
  apart.set_parameter(name, k_bias.clone());
  EXPECT_EQ(merged.merged_layers(), layers - 1);
  const at::Tensor tokens = at::tensor(std::vector<int64_t>(kPrompt.begin(), kPrompt.end()));
  const std::vector<int64_t> lens = {6, 8};
  test::expect_tensor_near(merged.forward_packed(tokens, lens), apart.forward_packed(tokens, lens),
                           1e-4);
  merged.set_deterministic(true);  // deterministic mode runs its own kernels, never merged
  EXPECT_EQ(merged.merged_layers(), 0);
}

// Writes `fresh` (as a trainer's masters) into `eng`'s sync buckets and takes the version.
void receive(LlmEngine& eng, WeightBuffers& wb, const NamedTensors& fresh) {
  std::vector<at::Tensor> masters;
  for (const auto& [name, t] : fresh) masters.push_back(t);
  for (size_t b = 0; b < wb.buckets().size(); ++b) {
    wb.layout().pack(masters, static_cast<int64_t>(b), wb.buckets()[b]);
  }
  eng.apply_weight_update(eng.weight_version() + 1);
}

TEST(MergedProjectionsTest, AWeightUpdateInTheSyncBucketsReachesTheMergedProducts) {
  EngineConfig cfg = test::test_engine_config("llama");
  cfg.merge_projections = true;
  LlmEngine eng(cfg);
  // Buckets of 1 MiB: every layer's q/k/v and gate/up land back to back in one bucket.
  WeightBuffers& wb = eng.attach_weight_buffers(/*bucket_bytes=*/1 << 20);
  EXPECT_EQ(eng.model().merged_layers(), eng.model_config().num_layers)
      << "the buckets keep each group adjacent";
  eng.generate(requests());  // the old weights' products and prefix cache

  auto fresh = random_init_weights(eng.model_config(), /*seed=*/99, at::kFloat);
  for (auto& [name, t] : fresh) t.mul_(4.0);
  receive(eng, wb, fresh);
  EXPECT_EQ(eng.model().merged_layers(), eng.model_config().num_layers);

  test::TempDir dir;
  write_model_dir(dir.path(), eng.model_config(), fresh, engine::ensure_default_tokenizer());
  EngineConfig ref_cfg = test::test_engine_config("llama");
  ref_cfg.model_dir = dir.path();
  LlmEngine ref(ref_cfg);  // the new weights from scratch, five products a layer
  test::expect_same_outputs(eng.generate(requests()), ref.generate(requests()), 1e-4);
}

}  // namespace
}  // namespace crl::engine

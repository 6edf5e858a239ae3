// The engine's weights living in sync buckets: views alias the buckets, and writing a bucket is a
// complete in-place weight update.
#include "engine/weight_buffers.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::engine {
namespace {

GenerateRequest greedy_request(const std::vector<int32_t>& prompt) {
  GenerateRequest r;
  r.prompt_token_ids = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  return r;
}

const std::vector<int32_t> kPrompt = {5, 17, 99, 250, 31, 8, 77, 140, 2, 64, 33, 12, 400, 7};

TEST(WeightBuffersTest, ParametersBecomeViewsOfTheBucketsWithoutChangingOutputs) {
  LlmEngine eng(test::test_engine_config());
  auto before = eng.generate({greedy_request(kPrompt)})[0].outputs[0].token_ids;
  WeightBuffers& wb = eng.attach_weight_buffers(/*bucket_bytes=*/64 << 10);
  ASSERT_GT(wb.layout().buckets().size(), 3u) << "a small cap gives several buckets";
  for (const auto& [name, t] : eng.model().named_parameters()) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    bool inside = false;
    for (const auto& b : wb.buckets()) {
      const auto* base = b.data_ptr<uint8_t>();
      inside = inside || (p >= base && p + t.nbytes() <= base + b.numel());
    }
    EXPECT_TRUE(inside) << name << " does not live in a bucket";
  }
  EXPECT_EQ(eng.generate({greedy_request(kPrompt)})[0].outputs[0].token_ids, before);
}

TEST(WeightBuffersTest, WritingTheBucketsIsAWholeInPlaceWeightUpdate) {
  EngineConfig cfg = test::test_engine_config();
  LlmEngine eng(cfg);
  WeightBuffers& wb = eng.attach_weight_buffers(/*bucket_bytes=*/100 << 10);
  eng.generate({greedy_request(kPrompt)});  // fills the prefix cache under version 0

  // New weights, as a trainer would send them: fp32 masters packed bucket by bucket.
  auto fresh = random_init_weights(eng.model_config(), /*seed=*/99, at::kFloat);
  for (auto& [name, t] : fresh) t.mul_(4.0);
  std::vector<at::Tensor> masters;
  for (auto& [name, t] : fresh) masters.push_back(t);
  for (size_t b = 0; b < wb.buckets().size(); ++b) {
    wb.layout().pack(masters, static_cast<int64_t>(b), wb.buckets()[b]);  // "received" in place
  }
  eng.bump_weight_version();

  const auto& params = eng.model().named_parameters();
  ASSERT_EQ(params.size(), fresh.size());
  for (size_t i = 0; i < params.size(); ++i) test::expect_tensor_equal(params[i].second, fresh[i].second);

  test::TempDir dir;
  write_model_dir(dir.path(), eng.model_config(), fresh, engine::ensure_default_tokenizer());
  EngineConfig ref_cfg = cfg;
  ref_cfg.model_dir = dir.path();
  LlmEngine ref(ref_cfg);
  auto updated = eng.generate({greedy_request(kPrompt)})[0];
  EXPECT_EQ(updated.num_cached_tokens, 0) << "KV from the old weights must not be reused";
  EXPECT_EQ(updated.weight_version, 1);
  EXPECT_EQ(updated.outputs[0].token_ids, ref.generate({greedy_request(kPrompt)})[0].outputs[0].token_ids);
}

}  // namespace
}  // namespace crl::engine

// The engine's weights living in sync buckets: views alias the buckets, and writing a bucket is a
// complete in-place weight update.
#include "engine/weight_buffers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>

#include "engine/engine_loop.h"
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
  eng.apply_weight_update(eng.weight_version() + 1);

  const auto& params = eng.model().named_parameters();
  ASSERT_EQ(params.size(), fresh.size());
  for (size_t i = 0; i < params.size(); ++i)
    test::expect_tensor_equal(params[i].second, fresh[i].second);

  test::TempDir dir;
  write_model_dir(dir.path(), eng.model_config(), fresh, engine::ensure_default_tokenizer());
  EngineConfig ref_cfg = cfg;
  ref_cfg.model_dir = dir.path();
  LlmEngine ref(ref_cfg);
  auto updated = eng.generate({greedy_request(kPrompt)})[0];
  EXPECT_EQ(updated.num_cached_tokens, 0) << "KV from the old weights must not be reused";
  EXPECT_EQ(updated.weight_version, 1);
  EXPECT_EQ(updated.outputs[0].token_ids,
            ref.generate({greedy_request(kPrompt)})[0].outputs[0].token_ids);
}

// An update lands while a request (n = 2, greedy) has generated 4 of its 10 tokens; the engine is
// told the new version with `policy`. Returns the request's final output and checks that every
// block was freed. `ref` runs the new weights from scratch.
struct InflightRun {
  RequestOutput out;
  std::vector<int32_t> before;  // tokens sampled under version 0
  std::unique_ptr<LlmEngine> ref;
};

InflightRun run_with_inflight_update(InflightPolicy policy, test::TempDir& dir) {
  EngineConfig cfg = test::test_engine_config();
  LlmEngine eng(cfg);
  WeightBuffers& wb = eng.attach_weight_buffers(/*bucket_bytes=*/100 << 10);
  GenerateRequest req = greedy_request(kPrompt);
  req.params.n = 2;
  req.request_id = "r";
  eng.add_request(req);
  InflightRun run;
  while (run.before.size() < 4) {
    for (auto& o : eng.step()) run.before = o.outputs[0].token_ids;
  }
  auto fresh = random_init_weights(eng.model_config(), /*seed=*/99, at::kFloat);
  for (auto& [name, t] : fresh) t.mul_(4.0);
  std::vector<at::Tensor> masters;
  for (auto& [name, t] : fresh) masters.push_back(t);
  for (size_t b = 0; b < wb.buckets().size(); ++b) {
    wb.layout().pack(masters, static_cast<int64_t>(b), wb.buckets()[b]);
  }
  eng.set_weight_version(1, policy);
  while (eng.has_unfinished()) {
    for (auto& o : eng.step()) run.out = o;
  }
  EXPECT_TRUE(run.out.finished);
  EXPECT_EQ(eng.scheduler().allocator().num_used_blocks(), 0) << "every block is freed";
  write_model_dir(dir.path(), eng.model_config(), fresh, engine::ensure_default_tokenizer());
  EngineConfig ref_cfg = cfg;
  ref_cfg.model_dir = dir.path();
  run.ref = std::make_unique<LlmEngine>(ref_cfg);
  return run;
}

TEST(WeightBuffersTest, InflightKeepContinuesOnTheOldKvAndRecordsBothVersions) {
  test::TempDir dir;
  InflightRun run = run_with_inflight_update(InflightPolicy::kKeep, dir);
  for (const auto& c : run.out.outputs) {
    ASSERT_EQ(c.token_ids.size(), 10u);
    EXPECT_EQ(std::vector<int32_t>(c.token_ids.begin(), c.token_ids.begin() + 4), run.before);
    std::vector<int64_t> want(10, 1);
    std::fill(want.begin(), want.begin() + 4, 0);
    EXPECT_EQ(c.token_versions, want);
    EXPECT_EQ(c.raw_logprobs.size(), 10u);
  }
  EXPECT_EQ(run.out.first_weight_version, 0);
  EXPECT_EQ(run.out.weight_version, 1);
}

TEST(WeightBuffersTest, InflightRecomputeContinuesAsTheNewWeightsWouldFromTheSameTokens) {
  test::TempDir dir;
  InflightRun run = run_with_inflight_update(InflightPolicy::kRecompute, dir);
  GenerateRequest cont = greedy_request(kPrompt);
  cont.prompt_token_ids.insert(cont.prompt_token_ids.end(), run.before.begin(), run.before.end());
  cont.params.max_tokens = 6;
  auto want = run.ref->generate({cont})[0].outputs[0];
  for (const auto& c : run.out.outputs) {
    ASSERT_EQ(c.token_ids.size(), 10u);
    EXPECT_EQ(std::vector<int32_t>(c.token_ids.begin(), c.token_ids.begin() + 4), run.before);
    EXPECT_EQ(std::vector<int32_t>(c.token_ids.begin() + 4, c.token_ids.end()), want.token_ids);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(c.raw_logprobs[4 + i], want.raw_logprobs[i], 1e-4);
    EXPECT_EQ(c.token_versions.front(), 0);
    EXPECT_EQ(c.token_versions.back(), 1);
  }
}

TEST(WeightBuffersTest, InflightAbortRestartsUnfinishedSequencesUnderTheNewWeights) {
  test::TempDir dir;
  InflightRun run = run_with_inflight_update(InflightPolicy::kAbort, dir);
  auto want = run.ref->generate({greedy_request(kPrompt)})[0].outputs[0];
  for (const auto& c : run.out.outputs) {
    EXPECT_EQ(c.token_ids, want.token_ids);
    EXPECT_EQ(c.token_versions, std::vector<int64_t>(10, 1));
    ASSERT_EQ(c.raw_logprobs.size(), 10u);
    for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(c.raw_logprobs[i], want.raw_logprobs[i], 1e-4);
  }
  EXPECT_EQ(run.out.first_weight_version, 1);
}

// A weight source over weights held in memory: version v (1, 2, ...) is `masters` once offered,
// packed into the engine's buckets as a sender's broadcast would land them.
class MemorySource : public sync::WeightSource {
 public:
  MemorySource(const sync::WeightLayout& layout, std::vector<at::Tensor> masters)
      : layout_(layout), masters_(std::move(masters)) {}
  void offer(int64_t version) { offered_ = version; }
  void fail_receives() { fail_ = true; }
  bool ready(int64_t version) const override { return version <= offered_; }
  sync::SyncStats receive(std::vector<at::Tensor>& buckets, int64_t version) override {
    if (fail_) throw std::runtime_error("broadcast timed out (test)");
    for (size_t b = 0; b < buckets.size(); ++b)
      layout_.pack(masters_, static_cast<int64_t>(b), buckets[b]);
    received_.push_back(version);
    sync::SyncStats st;
    st.version = version;
    return st;
  }
  std::vector<int64_t> received() const { return received_; }

 private:
  const sync::WeightLayout& layout_;
  std::vector<at::Tensor> masters_;
  std::atomic<int64_t> offered_{0};
  std::atomic<bool> fail_{false};
  std::vector<int64_t> received_;  // engine thread
};

std::vector<at::Tensor> scaled_random_weights(const ModelConfig& config,
                                              NamedTensors* named = nullptr) {
  auto fresh = random_init_weights(config, /*seed=*/99, at::kFloat);
  std::vector<at::Tensor> masters;
  for (auto& [name, t] : fresh) masters.push_back(t.mul_(4.0));
  if (named) *named = fresh;
  return masters;
}

TEST(WeightBuffersTest, TheEngineLoopTakesEachVersionFromItsSourceBetweenSteps) {
  EngineConfig cfg = test::test_engine_config();
  auto eng = std::make_unique<LlmEngine>(cfg);
  const sync::WeightLayout layout = eng->attach_weight_buffers(/*bucket_bytes=*/100 << 10).layout();
  const ModelConfig model_config = eng->model_config();
  NamedTensors fresh;
  auto source = std::make_shared<MemorySource>(layout, scaled_random_weights(model_config, &fresh));
  EngineLoop loop(std::move(eng));
  loop.set_weight_source(source, InflightPolicy::kKeep);
  loop.start();
  loop.wait_ready();
  GenerateRequest first = greedy_request(kPrompt);
  first.request_id = "before";
  auto ch = loop.submit({first});
  while (!ch->wait(0, std::chrono::milliseconds(100)).all_finished) {
  }
  EXPECT_EQ(loop.weight_version(), 0) << "nothing offered: no update";

  source->offer(1);
  ASSERT_TRUE(
      loop.wait_weight_version(1, std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  EXPECT_EQ(loop.weight_version(), 1);
  EXPECT_EQ(loop.gauges().weight_version, 1);
  EXPECT_GE(loop.weight_update_seconds(), 0.0);
  GenerateRequest second = greedy_request(kPrompt);
  second.request_id = "after";
  ch = loop.submit({second});
  RequestChannel::Snapshot snap;
  while (!(snap = ch->wait(0, std::chrono::milliseconds(100))).all_finished) {
  }
  loop.stop();
  EXPECT_EQ(source->received(), std::vector<int64_t>{1}) << "each version is received once";

  test::TempDir dir;
  write_model_dir(dir.path(), model_config, fresh, engine::ensure_default_tokenizer());
  EngineConfig ref_cfg = cfg;
  ref_cfg.model_dir = dir.path();
  LlmEngine ref(ref_cfg);
  const RequestOutput& out = *snap.outputs[0];
  EXPECT_EQ(out.weight_version, 1);
  EXPECT_EQ(out.num_cached_tokens, 0) << "KV from the old weights must not be reused";
  EXPECT_EQ(out.outputs[0].token_ids,
            ref.generate({greedy_request(kPrompt)})[0].outputs[0].token_ids);
}

TEST(WeightBuffersTest, AFailedReceiveStopsTheUpdatesAndItsWaitersHearWhy) {
  auto eng = std::make_unique<LlmEngine>(test::test_engine_config());
  const sync::WeightLayout layout = eng->attach_weight_buffers(/*bucket_bytes=*/100 << 10).layout();
  auto source = std::make_shared<MemorySource>(layout, scaled_random_weights(eng->model_config()));
  EngineLoop loop(std::move(eng));
  loop.set_weight_source(source, InflightPolicy::kKeep);
  loop.start();
  loop.wait_ready();
  source->fail_receives();
  source->offer(1);
  ASSERT_THROWS_WITH(
      loop.wait_weight_version(1, std::chrono::steady_clock::now() + std::chrono::seconds(30)),
      std::runtime_error, "weight update to version 1 failed: broadcast timed out (test)");
  EXPECT_EQ(loop.weight_version(), 0);
  EXPECT_NE(loop.weight_update_error().find("broadcast timed out"), std::string::npos);
}

TEST(WeightBuffersTest, ASourceOnAnEngineWithoutSyncBucketsIsAnErrorNotAWriteAnywhere) {
  auto eng = std::make_unique<LlmEngine>(test::test_engine_config());
  sync::WeightLayout layout = sync::WeightLayout::plan(weight_specs(eng->model()), 100 << 10);
  auto source = std::make_shared<MemorySource>(layout, scaled_random_weights(eng->model_config()));
  EngineLoop loop(std::move(eng));
  loop.set_weight_source(source, InflightPolicy::kKeep);
  loop.start();
  loop.wait_ready();
  source->offer(1);
  ASSERT_THROWS_WITH(
      loop.wait_weight_version(1, std::chrono::steady_clock::now() + std::chrono::seconds(30)),
      std::runtime_error, "attach_weight_buffers");
  EXPECT_TRUE(source->received().empty());
}

TEST(WeightBuffersTest, InflightPolicyNamesParseAndABadOneNamesTheChoices) {
  for (auto p : {InflightPolicy::kKeep, InflightPolicy::kRecompute, InflightPolicy::kAbort}) {
    EXPECT_EQ(parse_inflight_policy(inflight_policy_name(p)), p);
  }
  ASSERT_THROWS_WITH(parse_inflight_policy("drain"), std::invalid_argument,
                     "keep, recompute or abort");
}

}  // namespace
}  // namespace crl::engine

// Trainer against the engine: log-prob agreement, data-parallel equivalence, bf16 compute.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "common/check.h"
#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

// Rollouts of the engine on a few random prompts, packed into one micro-batch per `cap` tokens.
std::vector<MicroBatch> engine_rollouts(engine::LlmEngine& eng, int prompts, int n, int max_tokens,
                                        int64_t cap, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(4, 500), len(3, 12);
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < prompts; ++i) {
    engine::GenerateRequest r;
    for (int j = len(rng); j > 0; --j) r.prompt_token_ids.push_back(tok(rng));
    r.params.n = n;
    r.params.temperature = 1.0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.seed = seed + i;
    reqs.push_back(r);
  }
  std::vector<SampleGroup> groups;
  for (auto& out : eng.generate(reqs)) {
    SampleGroup g;
    g.prompt_ids = out.prompt_token_ids;
    for (auto& c : out.outputs) {
      Sample s;
      s.completion_ids = c.token_ids;
      s.logprobs = c.raw_logprobs;
      s.reward = static_cast<double>(c.token_ids[0] % 7);  // arbitrary but varied
      g.samples.push_back(s);
    }
    groups.push_back(g);
  }
  compute_group_advantages(groups);
  return pack_micro_batches(groups, cap);
}

at::Tensor loss_old(const MicroBatch& mb) {
  return mb.old_logprobs.index_select(0, mb.loss_mask.nonzero().squeeze(1));
}

TEST(TrainerTest, LogprobGapToTheEngineIsBelow1e4InFp32) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  Trainer trainer(cfg.model_dir, TrainerOptions{});
  auto mbs = engine_rollouts(eng, 4, 3, 10, 1 << 20, 11);
  ASSERT_EQ(mbs.size(), 1u);
  auto gap = (trainer.compute_logprobs(mbs[0]) - loss_old(mbs[0])).abs();
  EXPECT_LT(gap.max().item<float>(), 1e-4);
  EXPECT_EQ(gap.size(0), 4 * 3 * 10);
}

TEST(TrainerTest, LogprobGapIsExactlyZeroWhenEngineAndTrainerAreDeterministic) {
  engine::EngineConfig cfg = test::test_engine_config();
  cfg.deterministic = true;
  cfg.max_batched_tokens = 16;  // prompts prefilled in chunks, decodes mixed in
  engine::LlmEngine eng(cfg);
  TrainerOptions o;
  o.deterministic = true;
  Trainer trainer(cfg.model_dir, o);
  auto mbs = engine_rollouts(eng, 5, 3, 12, 1 << 20, 12);
  ASSERT_EQ(mbs.size(), 1u);
  auto lp = trainer.compute_logprobs(mbs[0]);
  test::expect_tensor_equal(lp, loss_old(mbs[0]));
  // The same holds with autograd on, as reported by a training step at step 0.
  StepStats st = trainer.train_step(mbs, LossKind::kGrpo);
  EXPECT_EQ(st.loss.logprob_gap_max, 0.0);
  EXPECT_EQ(st.loss.clip_fraction, 0.0);
  EXPECT_GT(st.grad_norm, 0.0);
}

// The CUDA path (ctest label `gpu`): engine and trainer both on the device in fp32; their
// log-probs of the engine's samples agree to cuBLAS's shape-dependent rounding, and a step trains.
TEST(CudaTrainerTest, TrainerLogprobsMatchTheEngineOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  engine::EngineConfig cfg = test::test_engine_config();
  cfg.device = "cuda";
  engine::LlmEngine eng(cfg);
  TrainerOptions o;
  o.device = "cuda";
  Trainer trainer(cfg.model_dir, o);
  auto mbs = engine_rollouts(eng, 4, 3, 10, 1 << 20, 11);
  ASSERT_EQ(mbs.size(), 1u);
  auto gap = (trainer.compute_logprobs(mbs[0]).to(at::kCPU) - loss_old(mbs[0]).to(at::kCPU)).abs();
  EXPECT_LT(gap.max().item<float>(), 2e-3);
  EXPECT_EQ(gap.size(0), 4 * 3 * 10);
  StepStats st = trainer.train_step(mbs, LossKind::kGrpo);
  EXPECT_TRUE(std::isfinite(st.grad_norm));
  EXPECT_GT(st.grad_norm, 0.0);
}

// A SUM all-reduce over `world` ranks running in threads of this process.
class InProcessAllReduce {
 public:
  explicit InProcessAllReduce(int world) : world_(world), slots_(world) {}
  void run(int rank, std::vector<at::Tensor>& buckets) {
    std::unique_lock<std::mutex> lock(mu_);
    slots_[rank] = &buckets;
    const int64_t gen = generation_;
    if (++arrived_ < world_) {
      cv_.wait(lock, [&] { return generation_ != gen; });
      return;
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      at::Tensor sum = at::zeros_like(buckets[b]);
      for (auto* s : slots_) sum += (*s)[b];
      for (auto* s : slots_) (*s)[b].copy_(sum);
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  }

 private:
  int world_;
  std::vector<std::vector<at::Tensor>*> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

TEST(TrainerTest, DataParallelHookOverTwoRanksEqualsOneRankWithAllMicroBatches) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 4, 4, 8, 60, 21);
  ASSERT_GE(mbs.size(), 4u);
  mbs.resize(4);
  TrainerOptions o;
  o.schedule.lr = 1e-3;
  o.schedule.warmup_steps = 1;
  o.weight_decay = 0.1;
  o.max_grad_norm = 0.5;  // clipping acts on the reduced gradient
  o.grad_bucket_bytes = 200 * 1024;  // several buckets
  Trainer single(cfg.model_dir, o);
  StepStats s1 = single.train_step(mbs, LossKind::kGrpo);
  StepStats s1b = single.train_step({mbs[1], mbs[3], mbs[0], mbs[2]}, LossKind::kGrpo);

  o.dp_world_size = 2;
  InProcessAllReduce reduce(2);
  Trainer r0(cfg.model_dir, o), r1(cfg.model_dir, o);
  r0.set_grad_all_reduce([&](std::vector<at::Tensor>& g) { reduce.run(0, g); });
  r1.set_grad_all_reduce([&](std::vector<at::Tensor>& g) { reduce.run(1, g); });
  StepStats a, b;
  std::thread t0([&] {
    a = r0.train_step({mbs[0], mbs[1]}, LossKind::kGrpo);
    r0.train_step({mbs[1], mbs[3]}, LossKind::kGrpo);
  });
  std::thread t1([&] {
    b = r1.train_step({mbs[2], mbs[3]}, LossKind::kGrpo);
    r1.train_step({mbs[0], mbs[2]}, LossKind::kGrpo);
  });
  t0.join();
  t1.join();
  EXPECT_NEAR(a.grad_norm, s1.grad_norm, 1e-5 * s1.grad_norm);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_GT(s1.grad_norm, o.max_grad_norm) << "the test should exercise clipping";
  for (size_t i = 0; i < single.master_weights().size(); ++i) {
    const auto& w = single.master_weights()[i].second;
    test::expect_tensor_near(r0.master_weights()[i].second, w, 1e-5);
    test::expect_tensor_equal(r0.master_weights()[i].second, r1.master_weights()[i].second);
  }
  (void)s1b;
}

TEST(TrainerTest, WorldSizeAboveOneWithoutAHookIsAnError) {
  engine::EngineConfig cfg = test::test_engine_config();
  TrainerOptions o;
  o.dp_world_size = 2;
  Trainer t(cfg.model_dir, o);
  ASSERT_THROWS_WITH(t.finish_step(), crl::CheckError, "set_grad_all_reduce");
}

TEST(TrainerTest, Bf16ComputeKeepsFp32MastersAndLowersTheSftLoss) {
  engine::EngineConfig cfg = test::test_engine_config();
  TrainerOptions o;
  o.dtype = "bfloat16";
  o.schedule.lr = 3e-3;
  Trainer t(cfg.model_dir, o);
  SampleGroup g;
  g.prompt_ids = {2, 40, 41, 42};
  Sample s;
  s.completion_ids = {50, 51, 52, 3};
  s.logprobs.assign(4, 0.0f);
  g.samples.push_back(s);
  auto mbs = pack_micro_batches({g}, 64);
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    StepStats st = t.train_step(mbs, LossKind::kSft);
    if (i == 0) first = st.loss.loss;
    last = st.loss.loss;
  }
  EXPECT_LT(last, 0.5 * first);
  for (const auto& [name, w] : t.master_weights()) EXPECT_EQ(w.scalar_type(), at::kFloat) << name;
  // The engine receives the weights in its own dtype, in place.
  engine::EngineConfig bf = cfg;
  bf.dtype = "bfloat16";
  engine::LlmEngine eng(bf);
  const void* before = eng.model().named_parameters()[0].second.data_ptr();
  t.copy_weights_to(eng.model());
  EXPECT_EQ(eng.model().named_parameters()[0].second.data_ptr(), before);
  test::expect_tensor_equal(eng.model().named_parameters()[0].second,
                            t.master_weights()[0].second.detach().to(at::kBFloat16));
}

TEST(TrainerTest, KlToTheFrozenReferenceStartsAtZeroAndGrowsAsThePolicyMoves) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 3, 4, 6, 1 << 20, 31);
  TrainerOptions o;
  o.schedule.lr = 2e-3;
  o.grpo.kl_coef = 0.1;
  Trainer t(cfg.model_dir, o);
  StepStats first = t.train_step(mbs, LossKind::kGrpo);
  EXPECT_EQ(first.loss.kl, 0.0);
  StepStats later;
  for (int i = 0; i < 3; ++i) later = t.train_step(mbs, LossKind::kGrpo);
  EXPECT_GT(later.loss.kl, 0.0);
  EXPECT_GT(later.loss.clip_fraction, 0.0) << "the policy moved away from the engine's";
  EXPECT_GT(later.loss.logprob_gap_max, 1e-3);
}

TEST(TrainerTest, MicroBatchesOverTheTokenCapAreRejected) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 2, 2, 6, 1 << 20, 41);
  TrainerOptions o;
  o.micro_batch_tokens = 16;
  Trainer t(cfg.model_dir, o);
  ASSERT_THROWS_WITH(t.train_step(mbs, LossKind::kGrpo), std::invalid_argument,
                     "exceeds micro_batch_tokens 16");
}

TEST(TrainerTest, WeightsLandInTheEnginesSyncBucketsInPlace) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  engine::WeightBuffers& wb = eng.attach_weight_buffers(256 * 1024);
  auto mbs = engine_rollouts(eng, 2, 4, 6, 1 << 20, 51);
  TrainerOptions o;
  o.schedule.lr = 1e-3;
  Trainer t(cfg.model_dir, o);
  t.train_step(mbs, LossKind::kGrpo);
  const at::Tensor bucket0 = wb.buckets()[0].clone();
  t.copy_weights_to(eng.model());
  eng.bump_weight_version();
  EXPECT_FALSE(at::equal(bucket0, wb.buckets()[0])) << "the update must land in the buckets";
  for (size_t i = 0; i < t.master_weights().size(); ++i) {
    test::expect_tensor_equal(eng.model().named_parameters()[i].second,
                              t.master_weights()[i].second.detach());
  }
  // The engine now samples from the trainer's weights: the gap to them is small again.
  auto fresh = engine_rollouts(eng, 2, 2, 6, 1 << 20, 52);
  auto gap = (t.compute_logprobs(fresh[0]) - loss_old(fresh[0])).abs();
  EXPECT_LT(gap.max().item<float>(), 1e-4);
  EXPECT_EQ(eng.weight_version(), 1);
}

}  // namespace
}  // namespace crl::trainer

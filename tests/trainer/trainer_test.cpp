// Trainer against the engine: log-prob agreement, bf16 compute, KL, masks, in-place landing.
// ZeRO stages: zero_test.cpp.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/check.h"
#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "tests/trainer/engine_rollouts.h"

namespace crl::trainer {
namespace {

using test::engine_rollouts;

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

// cpu_kernels "project" (the project's linear kernels forward and backward) trains as libtorch
// does, within float32 rounding, and keeps the engine's log-probs.
TEST(TrainerTest, ProjectKernelsTrainAsLibtorchDoes) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 4, 3, 10, 1 << 20, 11);
  TrainerOptions project;
  project.cpu_kernels = "project";
  project.schedule.lr = 1e-3;
  TrainerOptions libtorch = project;
  libtorch.cpu_kernels = "libtorch";
  Trainer tp(cfg.model_dir, project), tl(cfg.model_dir, libtorch);
  EXPECT_LT((tp.compute_logprobs(mbs[0]) - loss_old(mbs[0])).abs().max().item<float>(), 1e-4);
  for (int step = 0; step < 3; ++step) {
    const StepStats a = tp.train_step(mbs, LossKind::kGrpo);
    const StepStats b = tl.train_step(mbs, LossKind::kGrpo);
    EXPECT_NEAR(a.loss.loss, b.loss.loss, 1e-4 * (1 + std::abs(b.loss.loss))) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * (1 + b.grad_norm)) << "step " << step;
  }
  EXPECT_LT((tp.compute_logprobs(mbs[0]) - tl.compute_logprobs(mbs[0])).abs().max().item<float>(),
            1e-3);
  TrainerOptions bad;
  bad.cpu_kernels = "fast";
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "project or libtorch");
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

// Rollouts at temperature 0.6: the trainer scores them under softmax(logits / 0.6), the
// distribution the engine drew them from, so `old` (the engine's processed log-probs) is again its
// own value bit for bit; at temperature 1 the same rollouts would be scored off by up to nats.
TEST(TrainerTest, AtARolloutTemperatureTheLogprobGapIsExactlyZeroToo) {
  engine::EngineConfig cfg = test::test_engine_config();
  cfg.deterministic = true;
  engine::LlmEngine eng(cfg);
  TrainerOptions o;
  o.deterministic = true;
  o.grpo.temperature = 0.6;
  Trainer trainer(cfg.model_dir, o);
  auto mbs = engine_rollouts(eng, 4, 3, 10, 1 << 20, 12, 7, 0.6);
  ASSERT_EQ(mbs.size(), 1u);
  test::expect_tensor_equal(trainer.compute_logprobs(mbs[0]), loss_old(mbs[0]));
  StepStats st = trainer.train_step(mbs, LossKind::kGrpo);
  EXPECT_EQ(st.loss.logprob_gap_max, 0.0);
  EXPECT_EQ(st.loss.clip_fraction, 0.0);
  TrainerOptions at_one = o;
  at_one.grpo.temperature = 1.0;
  Trainer t1(cfg.model_dir, at_one);
  EXPECT_GT((t1.compute_logprobs(mbs[0]) - loss_old(mbs[0])).abs().max().item<float>(), 0.05);
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
                            t.master_weights()[0].second.to(at::kBFloat16));
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

// PPO mini-batches (RolloutConsumer::run_updates): an update inside a step moves the weights at
// the step's learning rate and leaves the schedule's step where it is; the step's last update
// advances it.
TEST(TrainerTest, UpdatesInsideAStepKeepTheStepsLearningRate) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 3, 4, 6, 1 << 20, 31);
  TrainerOptions o;
  o.schedule = LrSchedule{1e-3, 4, 0, 0};  // warmup: each step's rate differs
  Trainer t(cfg.model_dir, o);
  auto update = [&](bool last) {
    t.zero_grad();
    t.accumulate(mbs[0], LossKind::kGrpo, 1.0 / static_cast<double>(mbs[0].num_loss_tokens()));
    return t.finish_step(last);
  };
  const at::Tensor before = t.compute_logprobs(mbs[0]);
  const StepStats a = update(false);
  EXPECT_EQ(a.step, 0);
  EXPECT_EQ(t.step(), 0);
  const at::Tensor moved = t.compute_logprobs(mbs[0]);
  EXPECT_GT((moved - before).abs().max().item<float>(), 1e-6) << "the update moved the policy";
  const StepStats b = update(true);
  EXPECT_EQ(b.step, 1);
  EXPECT_EQ(b.lr, a.lr);
  EXPECT_DOUBLE_EQ(a.lr, lr_at(o.schedule, 0));
  EXPECT_GT((t.compute_logprobs(mbs[0]) - moved).abs().max().item<float>(), 1e-6);
  const StepStats c = update(true);
  EXPECT_EQ(c.step, 2);
  EXPECT_DOUBLE_EQ(c.lr, lr_at(o.schedule, 1));
  EXPECT_NE(c.lr, b.lr);
}

// Issue 28: tool/environment tokens inside a completion (loss mask 0) have no part in the step:
// NaN log-probs and advantages there give bit-identical gradients and weights, while the same NaN
// on a model token poisons the step (so the comparison can fail).
TEST(TrainerTest, MaskedToolTokensHaveNoPartInTheStep) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 3, 2, 10, 1 << 20, 17);
  ASSERT_EQ(mbs.size(), 1u);
  MicroBatch base = mbs[0];
  // In every sequence, completion positions 3..5 become tool tokens.
  std::vector<int64_t> tool_rows;
  int64_t start = 0;
  for (int64_t len : base.seq_lens) {
    int64_t first = start;
    while (base.loss_mask[first].item<float>() == 0.0f) ++first;
    for (int64_t k = 3; k < 6; ++k) tool_rows.push_back(first + k);
    start += len;
  }
  for (int64_t r : tool_rows) {
    base.loss_mask[r] = 0.0f;
    base.old_logprobs[r] = 0.0f;
    base.advantages[r] = 0.0f;
  }
  MicroBatch poisoned = base;
  poisoned.old_logprobs = base.old_logprobs.clone();
  poisoned.advantages = base.advantages.clone();
  for (int64_t r : tool_rows) {
    poisoned.old_logprobs[r] = std::nanf("");
    poisoned.advantages[r] = std::nanf("");
  }
  Trainer a(cfg.model_dir, TrainerOptions{}), b(cfg.model_dir, TrainerOptions{});
  StepStats sa = a.train_step({base}, LossKind::kGrpo);
  StepStats sb = b.train_step({poisoned}, LossKind::kGrpo);
  EXPECT_GT(sa.grad_norm, 0.0);
  EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  EXPECT_EQ(sa.loss.loss, sb.loss.loss);
  EXPECT_EQ(sa.loss.num_tokens, static_cast<int64_t>(3 * 2 * 10 - tool_rows.size()));
  auto wa = a.master_weights(), wb = b.master_weights();
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  // The same NaN on the mask: the step sees it.
  MicroBatch on = poisoned;
  on.loss_mask = base.loss_mask.clone();
  for (int64_t r : tool_rows) on.loss_mask[r] = 1.0f;
  Trainer c(cfg.model_dir, TrainerOptions{});
  EXPECT_TRUE(std::isnan(c.train_step({on}, LossKind::kGrpo).grad_norm));
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
  eng.apply_weight_update(eng.weight_version() + 1);
  EXPECT_FALSE(at::equal(bucket0, wb.buckets()[0])) << "the update must land in the buckets";
  const auto masters = t.master_weights();
  for (size_t i = 0; i < masters.size(); ++i) {
    test::expect_tensor_equal(eng.model().named_parameters()[i].second, masters[i].second);
  }
  // The engine now samples from the trainer's weights: the gap to them is small again.
  auto fresh = engine_rollouts(eng, 2, 2, 6, 1 << 20, 52);
  auto gap = (t.compute_logprobs(fresh[0]) - loss_old(fresh[0])).abs();
  EXPECT_LT(gap.max().item<float>(), 1e-4);
  EXPECT_EQ(eng.weight_version(), 1);
}

}  // namespace
}  // namespace crl::trainer

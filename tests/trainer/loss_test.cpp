#include "trainer/loss.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>
#include <memory>
#include <string>

#include "engine/model/transformer.h"
#include "engine/sampler.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "trainer/lr_schedule.h"
#include "trainer/micro_batch.h"

namespace crl::trainer {
namespace {

at::Tensor f(std::vector<float> v) { return at::tensor(v, at::kFloat); }

TEST(GrpoLossTest, OnPolicyLossIsMinusMeanAdvantageAndItsGradientIsAOverN) {
  auto old = f({-1.0f, -2.0f, -0.5f});
  auto lp = old.clone().requires_grad_(true);
  auto adv = f({1.0f, -2.0f, 0.5f});
  LossOutput out = grpo_loss(lp, old, adv, at::Tensor(), GrpoOptions{});
  EXPECT_NEAR(out.metrics.loss, -(1.0 - 2.0 + 0.5) / 3, 1e-7);
  EXPECT_EQ(out.metrics.clip_fraction, 0.0);
  EXPECT_EQ(out.metrics.logprob_gap_max, 0.0);
  EXPECT_EQ(out.metrics.mismatch_kl, 0.0);  // the same policy
  EXPECT_EQ(out.metrics.mismatch_k3_kl, 0.0);
  out.loss.backward();
  test::expect_tensor_near(lp.grad(), -adv / 3, 1e-7);
}

TEST(GrpoLossTest, RatiosOutsideTheClipRangeStopTheGradientAndCount) {
  auto old = f({0.0f, 0.0f, 0.0f, 0.0f}).log_softmax(0);
  // ratios 1.5, 0.5, 1.5, 0.5 with advantages +, -, -, +: the first two are clipped.
  auto lp = (old + f({std::log(1.5f), std::log(0.5f), std::log(1.5f), std::log(0.5f)}))
                .detach()
                .requires_grad_(true);
  auto adv = f({1.0f, -1.0f, -1.0f, 1.0f});
  GrpoOptions o;
  LossOutput out = grpo_loss(lp, old, adv, at::Tensor(), o);
  EXPECT_DOUBLE_EQ(out.metrics.clip_fraction, 1.0);  // every |r - 1| = 0.5 > 0.2
  out.loss.backward();
  auto g = lp.grad();
  EXPECT_EQ(g[0].item<float>(), 0.0f);              // r > 1 + eps with A > 0: clipped
  EXPECT_EQ(g[1].item<float>(), 0.0f);              // r < 1 - eps with A < 0: clipped
  EXPECT_NEAR(g[2].item<float>(), 1.5f / 4, 1e-6);  // -(r * A) / N, d/dlp = -r*A/N
  EXPECT_NEAR(g[3].item<float>(), -0.5f / 4, 1e-6);
  EXPECT_NEAR(out.metrics.logprob_gap_max, std::log(2.0), 1e-6);
  // KL(engine || trainer) on the sampled tokens: d = trainer - engine = log r.
  double kl = 0, k3 = 0;
  for (double r : {1.5, 0.5, 1.5, 0.5}) {
    kl += -std::log(r) / 4;
    k3 += (r - std::log(r) - 1) / 4;
  }
  EXPECT_NEAR(out.metrics.mismatch_kl, kl, 1e-6);
  EXPECT_NEAR(out.metrics.mismatch_k3_kl, k3, 1e-6);
  EXPECT_GT(out.metrics.mismatch_k3_kl, 0);
  // Micro-batches combine token-weighted.
  LossMetrics a = out.metrics, b;
  b.num_tokens = 4;
  const LossMetrics both = combine_loss_metrics({a, b});
  EXPECT_DOUBLE_EQ(both.mismatch_k3_kl, out.metrics.mismatch_k3_kl / 2);
}

TEST(GrpoLossTest, K3KlIsZeroAtTheReferenceAndPositiveAway) {
  auto lp = f({-1.0f, -2.0f}).requires_grad_(true);
  GrpoOptions o;
  o.kl_coef = 0.5;
  auto same = grpo_loss(lp, lp.detach(), f({0, 0}), lp.detach(), o);
  EXPECT_EQ(same.metrics.kl, 0.0);
  auto ref = f({-1.5f, -1.0f});
  auto away = grpo_loss(lp, lp.detach(), f({0, 0}), ref, o);
  double want = 0;
  for (int i = 0; i < 2; ++i) {
    const double d = ref[i].item<double>() - lp[i].item<double>();
    want += std::exp(d) - d - 1;
  }
  EXPECT_NEAR(away.metrics.kl, want / 2, 1e-6);
  EXPECT_NEAR(away.metrics.loss, 0.5 * want / 2, 1e-6);
}

TEST(GrpoLossTest, TruncatedImportanceSamplingWeightsByTheCappedTrainerEngineRatio) {
  auto engine_lp = f({-1.0f, -1.0f});
  auto lp = f({-0.5f, -1.2f}).requires_grad_(true);  // weights e^0.5 (capped to 1.2), e^-0.2
  auto adv = f({1.0f, 1.0f});
  GrpoOptions o;
  o.tis_cap = 1.2;
  LossOutput out = grpo_loss(lp, engine_lp, adv, at::Tensor(), o);
  const double w0 = 1.2, w1 = std::exp(-0.2);
  EXPECT_NEAR(out.metrics.loss, -(w0 + w1) / 2, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(lp.grad()[0].item<double>(), -w0 / 2, 1e-6);
  EXPECT_NEAR(lp.grad()[1].item<double>(), -w1 / 2, 1e-6);
}

TEST(GrpoLossTest, SftLossIsMeanNegativeLogLikelihood) {
  auto lp = f({-1.0f, -3.0f}).requires_grad_(true);
  LossOutput out = sft_loss(lp, at::Tensor());
  EXPECT_DOUBLE_EQ(out.metrics.loss, 2.0);
  EXPECT_EQ(out.metrics.logprob_gap_max, 0.0);
}

TEST(GrpoLossTest, TargetLogprobsAddTheRowsEntropiesAndCombineTokenWeighted) {
  // Row 0 uniform over 4 ids: ln 4; row 1 nearly one-hot: ~0.
  const at::Tensor logits = at::tensor(std::vector<float>{0, 0, 0, 0, 40, 0, 0, 0}).view({2, 4});
  double sum = 0.5;  // added to, not overwritten
  target_logprobs(logits, at::tensor(std::vector<int64_t>{1, 0}, at::kLong), true, &sum);
  EXPECT_NEAR(sum, 0.5 + std::log(4.0), 1e-6);
  LossMetrics a, b;
  a.entropy = 1.0, a.num_tokens = 3;
  b.entropy = 2.0, b.num_tokens = 1;
  EXPECT_DOUBLE_EQ(combine_loss_metrics({a, b}).entropy, 1.25);
}

TEST(GrpoLossTest, TargetLogprobsMatchTheEngineSamplerBitForBitWithLogSoftmaxGradient) {
  at::manual_seed(3);
  auto logits = (at::randn({5, 300}) * 4).requires_grad_(true);
  auto targets = at::tensor(std::vector<int64_t>{0, 17, 299, 5, 100}, at::kLong);
  auto lp = target_logprobs(logits, targets, /*match_engine=*/true);
  auto ref = engine::token_logprobs(logits.detach(), {0, 17, 299, 5, 100}, 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(lp[i].item<float>(), ref[i].first) << i;
  auto plain = target_logprobs(logits, targets, /*match_engine=*/false);
  test::expect_tensor_near(lp.detach(), plain.detach(), 1e-5);
  (lp * at::arange(5, at::kFloat)).sum().backward();
  auto g_match = logits.grad().clone();
  logits.mutable_grad().zero_();
  (plain * at::arange(5, at::kFloat)).sum().backward();
  test::expect_tensor_equal(g_match, logits.grad());
}

// GRPO at a rollout temperature T scores under softmax(logits / T), the distribution the engine
// sampled from: the values are the sampler's processed log-probs of its own draws, bit for bit,
// and the gradient is log_softmax(logits / T)'s (1/T times the softmax's at T).
TEST(GrpoLossTest, AtARolloutTemperatureTheLogprobsAreTheSamplersProcessedOnesBitForBit) {
  at::manual_seed(4);
  auto logits = (at::randn({6, 300}) * 4).requires_grad_(true);
  for (double t : {0.3, 0.7, 1.6}) {
    SCOPED_TRACE("temperature " + std::to_string(t));
    engine::SamplingParams p;
    p.temperature = t;
    std::vector<engine::SampleRow> rows;
    for (int r = 0; r < 6; ++r) rows.push_back(engine::SampleRow{r, &p, 11, 0, r, nullptr});
    const auto drawn = engine::sample_tokens(logits.detach(), rows);
    std::vector<int64_t> ids;
    for (const auto& d : drawn) ids.push_back(d.token);
    const auto targets = at::tensor(ids, at::kLong);
    auto lp = target_logprobs(logits, targets, /*match_engine=*/true, nullptr, t);
    for (int r = 0; r < 6; ++r) EXPECT_EQ(lp[r].item<float>(), drawn[r].processed_logprob) << r;
    // Not the raw (temperature 1) log-probs.
    EXPECT_GT((lp - target_logprobs(logits, targets, true)).abs().max().item<float>(), 1e-2);
    auto ref = at::log_softmax(logits / t, -1).gather(1, targets.unsqueeze(1)).squeeze(1);
    test::expect_tensor_near(lp.detach(), ref.detach(), 1e-5);
    logits.mutable_grad() = at::Tensor();
    (lp * at::arange(6, at::kFloat)).sum().backward();
    auto g = logits.grad().clone();
    logits.mutable_grad() = at::Tensor();
    (ref * at::arange(6, at::kFloat)).sum().backward();
    test::expect_tensor_near(g, logits.grad(), 1e-6, 1e-5);
  }
  // At 1 the tempered log-probs are token_logprobs' raw ones.
  const auto raw = engine::token_logprobs(logits.detach(), {1, 2, 3, 4, 5, 6}, 0);
  const auto one = engine::tempered_logprobs(logits.detach(), {1, 2, 3, 4, 5, 6}, 1.0);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(one[r], raw[r].first) << r;
  ASSERT_THROWS_WITH(target_logprobs(logits, at::zeros({6}, at::kLong), true, nullptr, 0.0),
                     std::logic_error, "temperature 0 must be > 0");
  GrpoOptions bad;
  bad.temperature = 0;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "'temperature': 0");
}

TEST(LrScheduleTest, WarmupThenCosineToTheFloor) {
  LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 1.0);
  EXPECT_NEAR(lr_at(s, 9), 0.55, 1e-12);  // halfway
  EXPECT_NEAR(lr_at(s, 14), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(s, 100), 0.1, 1e-12);
  s.total_steps = 2;  // shorter than the warmup: it still reaches the peak at its last step
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 1.0);
  s.total_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 50), 1.0);
  s.min_lr = 2.0;
  ASSERT_THROWS_WITH(s.validate(), std::invalid_argument, "min_lr");
}

}  // namespace
}  // namespace crl::trainer

namespace crl::trainer {
namespace {

// Issue 28: a tool token's logits perturbed leave the loss and its gradient unchanged (its loss
// weight is exactly 0). The loss of a packed micro-batch is computed as the trainer computes it:
// the rows on the loss mask (loss_token_rows), their logits (row j - 1 predicts token j), the
// engine-matched log-probs and the GRPO loss.
TEST(MaskedLossTest, ToolTokenLogitsPerturbedLeaveTheLossAndGradientUnchanged) {
  SampleGroup g;
  g.prompt_ids = {1, 2, 3};
  Sample s;
  s.completion_ids = {7, 8, 9, 10, 11, 12, 13};  // model, model, tool, tool, tool, model, model
  s.loss_mask = {1, 1, 0, 0, 0, 1, 1};
  s.logprobs = {-1.0f, -2.0f, -0.1f, -0.2f, -0.3f, -1.5f, -0.7f};
  s.advantage = 0.8;
  g.samples.push_back(s);
  MicroBatch mb = pack_micro_batches({g}, 64).at(0);
  const int64_t t = mb.num_tokens(), v = 16;
  at::Tensor rows = loss_token_rows(mb.loss_mask);
  ASSERT_EQ(rows.size(0), 4);
  auto loss_and_grad = [&](const at::Tensor& logits_in) {
    at::Tensor logits = logits_in.clone().requires_grad_(true);
    at::Tensor lp =
        target_logprobs(logits.index_select(0, rows - 1), mb.tokens.index_select(0, rows),
                        /*match_engine=*/true);
    LossOutput out = grpo_loss(lp, mb.old_logprobs.index_select(0, rows),
                               mb.advantages.index_select(0, rows), at::Tensor(), GrpoOptions{});
    out.loss.backward();
    return std::make_pair(out.loss.detach(), logits.grad());
  };
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor logits = at::randn({t, v}, gen, at::kFloat);
  auto [loss, grad] = loss_and_grad(logits);
  // The rows whose logits predict the tool tokens (positions 3 + 2, 3 + 3, 3 + 4: rows 4, 5, 6).
  at::Tensor perturbed = logits.clone();
  for (int64_t row : {4, 5, 6}) perturbed[row] += 50 * at::randn({v}, gen, at::kFloat);
  auto [loss2, grad2] = loss_and_grad(perturbed);
  EXPECT_TRUE(at::equal(loss, loss2));
  EXPECT_TRUE(at::equal(grad, grad2));
  for (int64_t row : {4, 5, 6}) EXPECT_EQ(grad[row].abs().max().item<float>(), 0.0f);
  // Not vacuous: a model token's logits perturbed do change the gradient.
  at::Tensor model_row = logits.clone();
  model_row[3] += 50 * at::randn({v}, gen, at::kFloat);
  EXPECT_FALSE(at::equal(loss_and_grad(model_row).second, grad));
}

}  // namespace
}  // namespace crl::trainer

namespace crl::trainer {
namespace {

// Issue 55 item 2: head_target_logprobs in chunks of rows against the whole head at once.
struct HeadRun {
  at::Tensor logprobs, grad_hidden, grad_head;
  double entropy = 0;
  std::string node;  // the result's grad_fn
};

class ChunkedHeadTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    engine::TransformerOptions o;
    o.deterministic = true;  // row-wise kernels: the same rows give the same bits in any chunk
    model_ = std::make_unique<engine::Transformer>(
        engine::Transformer::load(test::test_model_dir(GetParam()), o));
    for (const auto& [name, t] : model_->named_parameters()) {
      if (t.data_ptr() == model_->lm_head().data_ptr()) head_name_ = name;
    }
    ASSERT_FALSE(head_name_.empty());
    at::Generator gen = at::detail::createCPUGenerator(55);
    const int64_t h = model_->config().hidden_size, v = model_->config().vocab_size;
    hidden_ = at::randn({13, h}, gen, at::kFloat);
    targets_ = at::randint(v, {13}, gen, at::kLong);
    weights_ = at::randn({13}, gen, at::kFloat);
  }

  // The log-probs, their summed entropy and the gradients of sum(weights * log-probs).
  HeadRun run(int64_t chunk_rows, bool head_grad, double temperature = 1.0) {
    at::Tensor head = model_->lm_head().detach().clone().requires_grad_(head_grad);
    model_->set_parameter(head_name_, head);
    at::Tensor h = hidden_.clone().requires_grad_(true);
    HeadRun out;
    at::Tensor lp = head_target_logprobs(*model_, h, targets_, chunk_rows, /*match_engine=*/true,
                                         &out.entropy, temperature);
    out.node = lp.grad_fn() ? lp.grad_fn()->name() : "";
    (lp * weights_).sum().backward();
    out.logprobs = lp.detach();
    out.grad_hidden = h.grad();
    out.grad_head = head.grad();
    model_->set_parameter(head_name_, head.detach());
    return out;
  }

  std::unique_ptr<engine::Transformer> model_;
  std::string head_name_;
  at::Tensor hidden_, targets_, weights_;
};

TEST_P(ChunkedHeadTest, ChunksGiveTheWholeHeadsLogprobsEntropyAndGradients) {
  const HeadRun whole = run(13, true);
  EXPECT_EQ(whole.node.find("ChunkedHeadLogprobs"), std::string::npos) << whole.node;
  for (int64_t chunk : {1, 4, 5, 12}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    const HeadRun c = run(chunk, true);
    // The graph keeps no logits: the chunks' node recomputes them in backward.
    EXPECT_NE(c.node.find("ChunkedHeadLogprobs"), std::string::npos) << c.node;
    test::expect_tensor_equal(c.logprobs, whole.logprobs);
    EXPECT_NEAR(c.entropy, whole.entropy, 1e-6 * whole.entropy);  // fp32 sums per chunk
    test::expect_tensor_near(c.grad_hidden, whole.grad_hidden, 1e-6, 1e-5);
    test::expect_tensor_near(c.grad_head, whole.grad_head, 1e-6, 1e-5);
  }
  // Not vacuous: other weights give other gradients.
  weights_ = -weights_;
  EXPECT_FALSE(at::allclose(run(4, true).grad_head, whole.grad_head));
}

// At a rollout temperature the chunks' backward differentiates log_softmax(logits / T) too.
TEST_P(ChunkedHeadTest, AtATemperatureChunksGiveTheWholeHeadsLogprobsAndGradients) {
  const HeadRun whole = run(13, true, 0.6);
  const HeadRun c = run(4, true, 0.6);
  EXPECT_NE(c.node.find("ChunkedHeadLogprobs"), std::string::npos) << c.node;
  test::expect_tensor_equal(c.logprobs, whole.logprobs);
  EXPECT_NEAR(c.entropy, whole.entropy, 1e-6 * whole.entropy);
  test::expect_tensor_near(c.grad_hidden, whole.grad_hidden, 1e-6, 1e-5);
  test::expect_tensor_near(c.grad_head, whole.grad_head, 1e-6, 1e-5);
  // Not temperature 1's.
  const HeadRun one = run(4, true);
  EXPECT_FALSE(at::allclose(one.logprobs, c.logprobs));
  EXPECT_FALSE(at::allclose(one.grad_head, c.grad_head));
}

TEST_P(ChunkedHeadTest, AFrozenHeadGetsNoGradientAndTheRowsTheirs) {
  const HeadRun whole = run(13, false);
  const HeadRun c = run(3, false);
  test::expect_tensor_equal(c.logprobs, whole.logprobs);
  test::expect_tensor_near(c.grad_hidden, whole.grad_hidden, 1e-6, 1e-5);
  EXPECT_FALSE(c.grad_head.defined());
}

TEST_P(ChunkedHeadTest, WithoutAGraphTheChunksAreTheWholeHeadsValues) {
  const HeadRun whole = run(13, true);
  at::NoGradGuard no_grad;
  double entropy = 0;
  at::Tensor lp = head_target_logprobs(*model_, hidden_, targets_, 4, true, &entropy);
  EXPECT_FALSE(lp.requires_grad());
  test::expect_tensor_equal(lp, whole.logprobs);
  EXPECT_NEAR(entropy, whole.entropy, 1e-6 * whole.entropy);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, ChunkedHeadTest, ::testing::Values("llama", "qwen2"));

// bf16 compute: the chunks' products round per chunk (the head's gradient summed in fp32, handed
// on in bf16), the whole head's once: both as close to the fp32 gradient of the same bf16 weights
// and rows (within 2x in norm).
TEST(ChunkedHeadBf16Test, ChunksAreAsCloseToTheFp32GradientsAsTheWholeHead) {
  engine::TransformerOptions o;
  o.dtype = at::kBFloat16;
  engine::Transformer model = engine::Transformer::load(test::test_model_dir("qwen2"), o);
  engine::NamedTensors upcast;
  for (const auto& [name, t] : model.named_parameters())
    upcast.emplace_back(name, t.to(at::kFloat));
  engine::Transformer fp32(model.config(), upcast, engine::TransformerOptions{});
  at::Generator gen = at::detail::createCPUGenerator(7);
  const at::Tensor hidden = at::randn({11, model.config().hidden_size}, gen).to(at::kBFloat16);
  const at::Tensor targets = at::randint(model.config().vocab_size, {11}, gen, at::kLong);
  auto run = [&](engine::Transformer& m, int64_t chunk) {
    const std::string name = m.named_parameters().back().first;  // the untied head
    at::Tensor head = m.lm_head().detach().clone().requires_grad_(true);
    m.set_parameter(name, head);
    at::Tensor h = hidden.to(head.scalar_type()).clone().requires_grad_(true);
    at::Tensor lp = head_target_logprobs(m, h, targets, chunk, /*match_engine=*/false);
    lp.sum().backward();
    EXPECT_EQ(h.grad().scalar_type(), head.scalar_type());
    EXPECT_EQ(head.grad().scalar_type(), head.scalar_type());
    m.set_parameter(name, head.detach());
    return std::make_pair(h.grad().to(at::kFloat), head.grad().to(at::kFloat));
  };
  const auto [rh, rw] = run(fp32, 11);
  const auto [gh, gw] = run(model, 11);
  const auto [gh4, gw4] = run(model, 4);
  const double eh = (gh - rh).norm().item<double>(), ew = (gw - rw).norm().item<double>();
  EXPECT_GT(ew, 0.0);  // bf16 does round
  EXPECT_LE((gh4 - rh).norm().item<double>(), 2 * eh + 1e-6);
  EXPECT_LE((gw4 - rw).norm().item<double>(), 2 * ew);
  EXPECT_LT(ew, 0.01 * rw.norm().item<double>());
}

TEST(LogitsChunkRowsTest, TheOptionOrAsManyRowsAsMake1GiBOfLogits) {
  EXPECT_EQ(logits_chunk_rows(100, 151936), 100);
  EXPECT_EQ(logits_chunk_rows(0, 151936), (int64_t{1} << 30) / (4 * 151936));  // 1766
  EXPECT_EQ(logits_chunk_rows(0, 256), int64_t{1} << 20);
  EXPECT_EQ(logits_chunk_rows(0, int64_t{1} << 26), 64);  // at least 64 rows
}

}  // namespace
}  // namespace crl::trainer

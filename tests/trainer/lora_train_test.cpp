// LoRA training (issue 29): a trainer whose state is the adapter alone, against the full
// trainer, against an engine serving the adapter from its receive buffers, and through a PEFT
// checkpoint and a resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/llm_engine.h"
#include "engine/model/lora.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "tests/trainer/engine_rollouts.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace crl::trainer {
namespace {

namespace fs = std::filesystem;

// Engine rollouts, one micro-batch (requests without an adapter: the engine's policy adapter).
std::vector<MicroBatch> rollouts(engine::LlmEngine& eng, int prompts, int n, int max_tokens,
                                 uint64_t seed) {
  return test::engine_rollouts(eng, prompts, n, max_tokens, 1 << 20, seed, 5);
}

at::Tensor old_logprobs(const MicroBatch& mb) {
  return mb.old_logprobs.index_select(0, mb.loss_mask.nonzero().squeeze(1));
}

TrainerOptions lora_options(int64_t rank, const std::string& targets = "all-linear") {
  TrainerOptions o;
  o.schedule.lr = 1e-2;
  o.lora.rank = rank;
  o.lora.alpha = 16;
  o.lora.targets = targets;
  return o;
}

// B = 0: the adapter adds exactly nothing, so the first log-probs are the full trainer's. A step
// changes the adapter's A and B only; the state is the adapter's size, not the model's.
TEST(LoraTrainTest, ZeroBStartsAtTheBaseAndOnlyTheAdapterTrains) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = rollouts(eng, 4, 3, 8, 21);
  Trainer full(cfg.model_dir, TrainerOptions{});
  Trainer lora(cfg.model_dir, lora_options(4));
  test::expect_tensor_equal(lora.compute_logprobs(mbs[0]), full.compute_logprobs(mbs[0]));

  const engine::NamedTensors base_before = [&] {
    engine::NamedTensors c;
    for (const auto& [n, t] : lora.model_weights()) c.emplace_back(n, t.clone());
    return c;
  }();
  const engine::LoraAdapter before = lora.lora_adapter();
  const StepStats st = lora.train_step(mbs, LossKind::kGrpo);
  EXPECT_GT(st.grad_norm, 0.0);
  const engine::LoraAdapter after = lora.lora_adapter();
  // B had a gradient (A's is zero while B is zero: x A^T B^T's gradient in A is B^T-weighted).
  const int q = static_cast<int>(engine::LoraTarget::kQ);
  EXPECT_GT(after.b[0][q].abs().max().item<float>(), 0.0f);
  test::expect_tensor_equal(after.a[0][q], before.a[0][q]);
  for (size_t i = 0; i < base_before.size(); ++i) {
    test::expect_tensor_equal(lora.model_weights()[i].second, base_before[i].second);
  }
  // The trainable tensors are PEFT's, in lora_tensors order.
  const auto masters = lora.master_weights();
  ASSERT_EQ(masters.size(), static_cast<size_t>(eng.model_config().num_layers * 7 * 2));
  EXPECT_EQ(masters[0].first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(masters[1].first, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  // A second step moves the policy: its log-probs leave the base's.
  lora.train_step(mbs, LossKind::kGrpo);
  EXPECT_GT(
      (lora.compute_logprobs(mbs[0]) - full.compute_logprobs(mbs[0])).abs().max().item<float>(),
      1e-4f);
  // Training state: adapter-sized.
  const StateBytes lb = lora.state_bytes(), fb = full.state_bytes();
  EXPECT_LT(lb.total() * 5, fb.total());

  TrainerOptions bad = lora_options(4);
  bad.lora.targets = "q,qkv";
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "lora.targets");
  bad = lora_options(4);
  bad.lora.dropout = 1.0;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "lora.dropout");
}

// The RL job's path without the collective: the trainer's buckets copied into the engine's LoRA
// receive buffers (the layouts agree by hash), loaded into the policy slot; requests without an
// adapter then sample from the trained adapter, and the trainer's log-probs of those samples are
// the engine's: bit for bit in deterministic mode, to fp32 rounding otherwise.
class LoraSyncTest : public ::testing::TestWithParam<bool> {};

TEST_P(LoraSyncTest, AnEngineServingTheSyncedAdapterHasTheTrainersLogprobs) {
  const bool deterministic = GetParam();
  engine::EngineConfig cfg = test::test_engine_config("qwen2");
  cfg.deterministic = deterministic;
  cfg.max_batched_tokens = 16;  // chunked prefills and mixed decodes
  cfg.max_loras = 1;
  cfg.max_lora_rank = 4;
  cfg.lora_targets = "q,v,gate,down";
  engine::LlmEngine eng(cfg);
  TrainerOptions o = lora_options(4, cfg.lora_targets);
  o.deterministic = deterministic;
  o.grad_bucket_bytes = 64 * 1024;  // several buckets
  Trainer tr(cfg.model_dir, o);
  engine::LoraBuffers& lb = eng.loras().attach_policy(
      "policy",
      engine::make_lora_adapter(eng.model_config(), 4, 16,
                                engine::parse_lora_targets(cfg.lora_targets), 1, false),
      o.grad_bucket_bytes, 1, eng.weight_version());
  ASSERT_EQ(lb.layout().hash(), tr.layout().hash());
  ASSERT_GT(lb.buckets().size(), 1u);

  auto mbs = rollouts(eng, 4, 3, 8, 31);
  for (int s = 0; s < 2; ++s) tr.train_step(mbs, LossKind::kGrpo);
  for (size_t b = 0; b < lb.buckets().size(); ++b) lb.buckets()[b].copy_(tr.buckets()[b]);
  eng.apply_weight_update(1);
  const auto masters = tr.master_weights();
  const auto received = engine::lora_tensors(lb.adapter());
  ASSERT_EQ(received.size(), masters.size());
  for (size_t i = 0; i < masters.size(); ++i)
    test::expect_tensor_equal(received[i].second, masters[i].second);

  auto fresh = rollouts(eng, 5, 3, 10, 32);
  ASSERT_EQ(fresh.size(), 1u);
  const at::Tensor gap = (tr.compute_logprobs(fresh[0]) - old_logprobs(fresh[0])).abs();
  if (deterministic) {
    EXPECT_EQ(gap.max().item<float>(), 0.0f);
  } else {
    EXPECT_LT(gap.max().item<float>(), 1e-4f);
  }
  // And the adapter is what the engine sampled from: the base's log-probs of them differ.
  Trainer base(cfg.model_dir, [&] {
    TrainerOptions b;
    b.deterministic = deterministic;
    return b;
  }());
  EXPECT_GT((base.compute_logprobs(fresh[0]) - old_logprobs(fresh[0])).abs().max().item<float>(),
            1e-3f);
}

INSTANTIATE_TEST_SUITE_P(LoraTrain, LoraSyncTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Deterministic" : "Default";
                         });

// A checkpoint is the adapter in PEFT's files (the masters, fp32) plus the optimizer state; a
// trainer made from the base and resumed from it takes the same next step as the one that went on.
TEST(LoraTrainTest, ACheckpointIsAPeftAdapterAndResumesTheSameStep) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = rollouts(eng, 3, 3, 6, 41);
  test::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  Trainer a(cfg.model_dir, lora_options(2));
  for (int s = 0; s < 2; ++s) a.train_step(mbs, LossKind::kGrpo);
  save_checkpoint(a, dir, cfg.model_dir, nlohmann::json::object(), /*merged=*/true);
  EXPECT_TRUE(fs::exists(dir + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  {  // merged/: a model directory whose plain forward is the adapted trainer's
    Trainer merged(dir + "/merged", TrainerOptions{});
    EXPECT_LT(
        (merged.compute_logprobs(mbs[0]) - a.compute_logprobs(mbs[0])).abs().max().item<float>(),
        1e-4f);
    Trainer base(cfg.model_dir, TrainerOptions{});
    EXPECT_GT(
        (base.compute_logprobs(mbs[0]) - a.compute_logprobs(mbs[0])).abs().max().item<float>(),
        1e-3f);
  }
  EXPECT_EQ(read_checkpoint_state(dir).lora.value("rank", 0), 2);
  const engine::LoraAdapter saved = engine::load_peft_adapter(dir, a.config());
  const auto masters = a.master_weights();
  const auto files = engine::lora_tensors(saved);
  ASSERT_EQ(files.size(), masters.size());
  for (size_t i = 0; i < masters.size(); ++i)
    test::expect_tensor_equal(files[i].second, masters[i].second);

  Trainer b(cfg.model_dir, lora_options(2));
  load_trainer_state(b, dir);
  EXPECT_EQ(b.step(), 2);
  const StepStats sa = a.train_step(mbs, LossKind::kGrpo);
  const StepStats sb = b.train_step(mbs, LossKind::kGrpo);
  EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  EXPECT_EQ(sa.loss.loss, sb.loss.loss);
  const auto wa = a.master_weights(), wb = b.master_weights();
  for (size_t i = 0; i < wa.size(); ++i) test::expect_tensor_equal(wa[i].second, wb[i].second);

  // Resumed with another rank, or as full fine-tuning: named errors.
  Trainer other(cfg.model_dir, lora_options(3));
  ASSERT_THROWS_WITH(load_trainer_state(other, dir), std::invalid_argument, "--lora-rank 3");
  Trainer full(cfg.model_dir, TrainerOptions{});
  ASSERT_THROWS_WITH(load_trainer_state(full, dir), std::invalid_argument,
                     "the checkpoint is a LoRA adapter of rank 2 trained on");
  ASSERT_THROWS_WITH(
      save_checkpoint(full, tmp.file("x"), cfg.model_dir, nlohmann::json::object(), true),
      std::invalid_argument, "a merged model needs a LoRA trainer");
}

// --resume of a LoRA run with --kl-coef names the initial model as the reference: that is the base
// the trainer adapts, so the reference shares it (no second copy of the model) and the resumed
// run's steps, KL included, are the uninterrupted run's.
TEST(LoraTrainTest, AResumedKlReferenceSharesTheBaseAndContinuesTheRun) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = rollouts(eng, 3, 3, 6, 47);
  test::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  TrainerOptions o = lora_options(2);
  o.grpo.kl_coef = 0.5;
  Trainer a(cfg.model_dir, o);
  const int64_t adapter_bytes = a.state_bytes().parameters;
  EXPECT_EQ(a.reference_bytes(), adapter_bytes);  // the adapter's frozen copy; the base is shared
  for (int s = 0; s < 2; ++s) a.train_step(mbs, LossKind::kGrpo);
  save_checkpoint(a, dir, cfg.model_dir, nlohmann::json::object(), /*merged=*/false);

  o.reference_model_dir = cfg.model_dir + "/";  // another spelling of the same directory
  Trainer b(cfg.model_dir, o);
  load_trainer_state(b, dir);
  EXPECT_EQ(b.reference_bytes(), 0);
  const StepStats sa = a.train_step(mbs, LossKind::kGrpo);
  const StepStats sb = b.train_step(mbs, LossKind::kGrpo);
  EXPECT_GT(sa.loss.kl, 0.0);
  EXPECT_EQ(sa.loss.kl, sb.loss.kl);
  EXPECT_EQ(sa.loss.loss, sb.loss.loss);
  EXPECT_EQ(sa.grad_norm, sb.grad_norm);

  // Full fine-tuning's reference is its own copy of the model.
  TrainerOptions full;
  full.grpo.kl_coef = 0.5;
  Trainer f(cfg.model_dir, full);
  EXPECT_EQ(f.reference_bytes(), f.state_bytes().parameters);
}

// Activation checkpointing recomputes each layer in backward: with a frozen embedding the first
// layer's input needs no gradient, and the adapters still train as without checkpointing.
TEST(LoraTrainTest, ActivationCheckpointingTrainsTheAdapterAsWithout) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = rollouts(eng, 3, 3, 6, 61);
  TrainerOptions o = lora_options(4);
  Trainer plain(cfg.model_dir, o);
  o.activation_checkpointing = true;
  Trainer ckpt(cfg.model_dir, o);
  for (int s = 0; s < 2; ++s) {
    const StepStats a = plain.train_step(mbs, LossKind::kGrpo);
    const StepStats b = ckpt.train_step(mbs, LossKind::kGrpo);
    EXPECT_GT(b.grad_norm, 0.0);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm) << "step " << s;
  }
  const auto wa = plain.master_weights(), wb = ckpt.master_weights();
  for (size_t i = 0; i < wa.size(); ++i) test::expect_tensor_near(wb[i].second, wa[i].second, 1e-6);
  o.lora.dropout = 0.1;
  ASSERT_THROWS_WITH(o.validate(), std::invalid_argument,
                     "must be 0 with activation checkpointing");
}

// ZeRO over two ranks shards the adapter's state and trains as one rank does.
TEST(LoraTrainTest, TwoShardedRanksTrainTheAdapterAsOneRank) {
  engine::EngineConfig cfg = test::test_engine_config();
  engine::LlmEngine eng(cfg);
  auto mbs = rollouts(eng, 4, 4, 6, 51);
  Trainer one(cfg.model_dir, lora_options(4));
  one.set_grad_scale([] { return 1.0; });
  one.train_step(mbs, LossKind::kGrpo);
  const auto want = one.master_weights();
  engine::NamedTensors got;
  auto errors = test::run_ranks(
      2, std::chrono::milliseconds(60000), [&](int r, auto& comm, const sync::StorePtr&) {
        TrainerOptions o = lora_options(4);
        o.group = comm.get();
        o.zero_stage = 2;
        Trainer t(cfg.model_dir, o);
        // Rank 0 trains the batch, rank 1 an empty round: the summed gradient is the one rank's.
        t.set_grad_scale([] { return 1.0; });
        t.zero_grad();
        if (r == 0) {
          t.accumulate(mbs[0], LossKind::kGrpo, 1.0, true);
        } else {
          t.accumulate_empty();
        }
        t.finish_step();
        EXPECT_LT(t.state_bytes().optimizer * 3, one.state_bytes().optimizer * 2);
        auto w = t.master_weights(r == 0);
        if (r == 0) got = std::move(w);
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    test::expect_tensor_near(got[i].second, want[i].second, 1e-6);
}

}  // namespace
}  // namespace crl::trainer

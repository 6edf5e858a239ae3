// ZeRO stages 1-3 over Gloo ranks in threads: each stage trains as stage 0 and as one rank,
// checkpoints re-shard, stage 3 gathers a layer (or a weight update's run) at a time.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/check.h"
#include "engine/llm_engine.h"
#include "engine/model/model_writer.h"
#include "sync/communicator.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "tests/trainer/engine_rollouts.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace crl::trainer {
namespace {

using test::engine_rollouts;

// ZeRO over Gloo ranks in threads: stages 1 and 2 against stage 0 and against one rank.
struct ZeroRun {
  std::vector<double> grad_norms, losses;  // rank 0's, per step
  engine::NamedTensors weights;            // gathered masters after the steps
  StateBytes bytes;                        // rank 0's
};

TrainerOptions zero_options() {
  TrainerOptions o;
  o.schedule.lr = 1e-3;
  o.schedule.warmup_steps = 1;
  o.weight_decay = 0.1;
  o.max_grad_norm = 0.5;             // clipping acts on the reduced gradient
  o.grad_bucket_bytes = 200 * 1024;  // several buckets
  return o;
}

// `ranks` train ranks at `stage`, `steps` steps; rank r trains micro-batches r, r + ranks, ...
ZeroRun run_zero(const std::string& model_dir, const std::vector<MicroBatch>& mbs, int ranks,
                 int stage, int steps, const std::string& resume_dir = "",
                 const std::string& save_dir = "", int save_after = -1) {
  ZeroRun out;
  auto errors = test::run_ranks(ranks, std::chrono::milliseconds(60000),
                                [&](int r, auto& comm, const sync::StorePtr&) {
                                  TrainerOptions o = zero_options();
                                  o.group = comm.get();
                                  o.zero_stage = stage;
                                  Trainer t(resume_dir.empty() ? model_dir : resume_dir, o);
                                  if (!resume_dir.empty()) load_trainer_state(t, resume_dir);
                                  std::vector<MicroBatch> mine;
                                  for (size_t i = r; i < mbs.size(); i += ranks)
                                    mine.push_back(mbs[i]);
                                  for (int s = 0; s < steps; ++s) {
                                    StepStats st = t.train_step(mine, LossKind::kGrpo);
                                    if (r == 0) {
                                      out.grad_norms.push_back(st.grad_norm);
                                      out.losses.push_back(st.loss.loss);
                                    }
                                    if (s + 1 == save_after) save_checkpoint(t, save_dir, "");
                                  }
                                  auto w = t.master_weights(r == 0);
                                  if (r == 0) {
                                    out.weights = std::move(w);
                                    out.bytes = t.state_bytes();
                                  }
                                });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return out;
}

std::vector<MicroBatch> six_micro_batches(const std::string& model_dir) {
  engine::EngineConfig cfg = test::test_engine_config();
  cfg.model_dir = model_dir;
  engine::LlmEngine eng(cfg);
  auto mbs = engine_rollouts(eng, 6, 4, 8, 60, 61);
  EXPECT_GE(mbs.size(), 6u);
  mbs.resize(6);
  return mbs;
}

// Losses are rank 0's own micro-batches: compared only between runs with the same ranks.
void expect_same_training(const ZeroRun& a, const ZeroRun& b, const std::string& what,
                          bool same_ranks = true, double weight_atol = 2e-5) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.grad_norms.size(), b.grad_norms.size());
  for (size_t i = 0; i < a.grad_norms.size(); ++i) {
    EXPECT_NEAR(a.grad_norms[i], b.grad_norms[i], 1e-5 * b.grad_norms[i]) << "step " << i + 1;
    if (same_ranks) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(b.losses[i]) + 1e-7)
          << "step " << i + 1;
    }
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    test::expect_tensor_near(a.weights[i].second, b.weights[i].second, weight_atol);
  }
}

class ZeroStageTest : public ::testing::TestWithParam<int> {};

TEST_P(ZeroStageTest, StagesOneAndTwoTrainAsStageZeroAndOneRankOverFiveSteps) {
  const int ranks = GetParam();
  const std::string dir = test::test_engine_config().model_dir;
  auto mbs = six_micro_batches(dir);
  ZeroRun one = run_zero(dir, mbs, 1, 0, 5);
  ZeroRun z0 = run_zero(dir, mbs, ranks, 0, 5);
  ZeroRun z1 = run_zero(dir, mbs, ranks, 1, 5);
  ZeroRun z2 = run_zero(dir, mbs, ranks, 2, 5);
  ZeroRun z3 = run_zero(dir, mbs, ranks, 3, 5);
  EXPECT_GT(one.grad_norms[0], 0.5) << "the test should exercise clipping";
  // Summing over ranks reorders fp32 additions; Adam turns the last bits of a near-zero gradient
  // into up to ~lr / 10 of weight over five steps.
  expect_same_training(z0, one, "stage 0 vs one rank", /*same_ranks=*/false, 1e-4);
  expect_same_training(z1, z0, "stage 1 vs stage 0");
  expect_same_training(z2, z0, "stage 2 vs stage 0");
  expect_same_training(z3, z0, "stage 3 vs stage 0");
  // The optimizer state is sharded 1/T (slices padded to 64 elements per bucket).
  EXPECT_LT(z1.bytes.optimizer, z0.bytes.optimizer / ranks + 64 * 4 * 3 * 16);
  EXPECT_NEAR(z1.bytes.gradients, z0.bytes.gradients, 64 * 4 * ranks * 16);  // padding
  EXPECT_LT(z2.bytes.gradients, z0.bytes.gradients / ranks + z0.bytes.gradients / 2);
  EXPECT_NEAR(z2.bytes.parameters, z0.bytes.parameters, 64 * 4 * ranks * 16);
  // Stage 3's parameters: the slices plus what was gathered at most (ZeroTest.StageThree* bounds
  // it on a model with more layers than this one's 3).
  EXPECT_EQ(z3.bytes.gradients, z2.bytes.gradients);
  EXPECT_EQ(z3.bytes.optimizer, z2.bytes.optimizer);
}

INSTANTIATE_TEST_SUITE_P(TrainRanks, ZeroStageTest, ::testing::Values(2, 3));

TEST(ZeroTest, ACheckpointOfTwoShardedRanksResumesAtOneAndThreeRanks) {
  const std::string dir = test::test_engine_config().model_dir;
  auto mbs = six_micro_batches(dir);
  test::TempDir tmp;
  const std::string ckpt = tmp.file("ckpt");
  ZeroRun straight = run_zero(dir, mbs, 2, 2, 4, "", ckpt, 2);
  ZeroRun at1 = run_zero(dir, mbs, 1, 0, 2, ckpt);
  ZeroRun at3 = run_zero(dir, mbs, 3, 2, 2, ckpt);
  ZeroRun at3_z3 = run_zero(dir, mbs, 3, 3, 2, ckpt);  // and re-sharded to ZeRO-3's slices
  for (const ZeroRun* r : {&at1, &at3, &at3_z3}) {
    ASSERT_EQ(r->weights.size(), straight.weights.size());
    for (size_t i = 0; i < r->weights.size(); ++i) {
      test::expect_tensor_near(r->weights[i].second, straight.weights[i].second, 1e-4);
    }
  }
  EXPECT_NEAR(at3.grad_norms.back(), straight.grad_norms.back(), 1e-5 * straight.grad_norms.back());
}

// Stage 3 from a checkpoint: each rank reads only its slices (no rank holds the whole model, the
// ranks together read it once), and the fp32 masters gathered are the checkpoint's bits.
TEST(ZeroTest, StageThreeRanksReadOnlyTheirSlicesOfTheCheckpoint) {
  const std::string dir = test::test_engine_config().model_dir;
  const auto specs = engine::model_param_specs(engine::load_model_config(dir));
  const engine::NamedTensors want = engine::load_checkpoint(dir, specs, at::kFloat);
  int64_t total = 0;
  for (const auto& [name, t] : want) total += t.numel();
  const int ranks = 3;
  std::vector<int64_t> read(ranks, 0);
  size_t buckets = 0;
  auto errors = test::run_ranks(
      ranks, std::chrono::milliseconds(30000), [&](int r, auto& comm, const sync::StorePtr&) {
        const engine::CheckpointReader reader(dir, specs);
        TrainStateOptions o;
        o.zero_stage = 3;
        o.compute_dtype = at::kBFloat16;  // the masters come from the reads, not the bf16 copy
        o.bucket_bytes = 64 * 1024;
        TrainState state(
            specs,
            [&reader](size_t i, int64_t from, int64_t count) {
              return reader.load_range(i, from, count, at::kFloat);
            },
            o, comm.get());
        read[r] = reader.elements_read();
        buckets = state.layout().buckets().size();
        engine::NamedTensors masters = state.gather(0, r == 0);
        if (r != 0) return;
        ASSERT_EQ(masters.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          test::expect_tensor_equal(masters[i].second.cpu(), want[i].second);
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ASSERT_GT(buckets, 2u);
  int64_t sum = 0;
  for (int r = 0; r < ranks; ++r) {
    EXPECT_LE(read[r], total / ranks + static_cast<int64_t>(buckets) * 64) << "rank " << r;
    sum += read[r];
  }
  EXPECT_EQ(sum, total);
}

// A streamed weight update (RolloutConsumer::send): stage 3 gathers the buckets a run of
// parameters needs, drops the runs before, and so holds about one run at a time -- here runs of a
// bf16 sync layout whose buckets straddle the trainer's fp32 ones (the cast path), and runs of
// the trainer's own buckets keeping every other one (fan-out over own buffers). Each run's
// parameters are the model's; the peak is a run's buckets and one buffer more, far below the
// whole gather's.
TEST(ZeroTest, StageThreeStreamsAWeightUpdateARunOfParametersAtATime) {
  const std::string dir = test::test_engine_config().model_dir;
  const auto specs = engine::model_param_specs(engine::load_model_config(dir));
  const engine::NamedTensors want = engine::load_checkpoint(dir, specs, at::kFloat);
  std::vector<sync::TensorSpec> bf16;
  for (const auto& spec : specs) bf16.push_back({spec.name, spec.shape, at::kBFloat16});
  const sync::WeightLayout sync_layout = sync::WeightLayout::plan(bf16, 40 * 1024);
  auto errors = test::run_ranks(
      2, std::chrono::milliseconds(30000), [&](int r, auto& comm, const sync::StorePtr&) {
        TrainStateOptions o;
        o.zero_stage = 3;
        o.bucket_bytes = 64 * 1024;
        TrainState state(want, o, comm.get());
        const sync::WeightLayout& own = state.layout();
        ASSERT_GT(own.buckets().size(), 6u);
        std::vector<int64_t> bucket_of(want.size());
        for (const auto& b : own.buckets())
          for (const auto& e : b.entries) bucket_of[e.tensor] = b.index;
        auto check = [&](int64_t first, int64_t end, const std::function<bool(int64_t)>& keep) {
          for (int64_t i = first; i < end; ++i) {
            if (!keep(bucket_of[i])) continue;
            test::expect_tensor_equal(state.parameters()[i].second, want[i].second);
          }
        };
        // The whole gather, for scale.
        state.acquire_buckets([](int64_t) { return true; });
        state.release_kept();
        const int64_t whole = state.update_gathered_peak();
        EXPECT_GE(whole, own.total_bytes());

        // The cast path: runs of the bf16 layout (chunks of 80 KiB), every bucket kept.
        int64_t most = 0;
        for (const auto& [first, end] : sync_layout.chunks(80 * 1024)) {
          const int64_t p0 = sync_layout.buckets()[first].entries.front().tensor;
          const int64_t p1 = sync_layout.buckets()[end - 1].entries.back().tensor + 1;
          state.acquire_parameters(p0, p1, [](int64_t) { return true; });
          check(p0, p1, [](int64_t) { return true; });
          int64_t run = 0;
          for (int64_t b = bucket_of[p0]; b <= bucket_of[p1 - 1]; ++b)
            run += own.buckets()[b].nbytes;
          most = std::max(most, run);
        }
        state.release_kept();
        const int64_t cast_peak = state.update_gathered_peak();
        EXPECT_LE(cast_peak, most + 2 * own.max_bucket_nbytes());
        EXPECT_LT(cast_peak, whole / 2);

        // Own buffers: runs of two of the trainer's buckets, rank r keeping buckets b % 2 == r.
        auto mine = [r](int64_t b) { return b % 2 == r; };
        for (const auto& [first, end] : own.chunks(2 * own.max_bucket_nbytes())) {
          const int64_t p0 = own.buckets()[first].entries.front().tensor;
          const int64_t p1 = own.buckets()[end - 1].entries.back().tensor + 1;
          state.acquire_parameters(p0, p1, mine);
          check(p0, p1, mine);
        }
        state.release_kept();
        EXPECT_LE(state.update_gathered_peak(), 3 * own.max_bucket_nbytes());
        // Runs go forward only, and a bucket dropped is not read again.
        state.acquire_parameters(static_cast<int64_t>(want.size()) - 1,
                                 static_cast<int64_t>(want.size()), mine);
        ASSERT_THROWS_WITH(state.acquire_parameters(0, 1, mine), CheckError, "already dropped");
        state.release_kept();
        state.acquire_parameters(0, 1, [](int64_t) { return false; });
        ASSERT_THROWS_WITH(state.acquire_parameters(0, 1, mine), CheckError, "already dropped");
        state.release_kept();
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ZeroTest, ActivationCheckpointingGivesTheSameGradientsAndWeights) {
  const std::string dir = test::test_engine_config().model_dir;
  auto mbs = six_micro_batches(dir);
  TrainerOptions o = zero_options();
  Trainer plain(dir, o);
  o.activation_checkpointing = true;
  Trainer ckpt(dir, o);
  for (int s = 0; s < 2; ++s) {
    StepStats a = plain.train_step(mbs, LossKind::kGrpo);
    StepStats b = ckpt.train_step(mbs, LossKind::kGrpo);
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-6 * a.grad_norm);
    EXPECT_NEAR(b.loss.loss, a.loss.loss, 1e-6);
  }
  auto wa = plain.master_weights(), wb = ckpt.master_weights();
  for (size_t i = 0; i < wa.size(); ++i) test::expect_tensor_near(wb[i].second, wa[i].second, 1e-6);
}

// Issue 55 item 2: logits in chunks of 3 loss rows (recomputed in backward, the head's gradient
// summed over the chunks) train as the whole micro-batch's logits, with the KL reference (its
// chunks without a graph) and on the tied and the untied head.
TEST(ZeroTest, ChunkedLogitsGiveTheSameGradientsAndWeights) {
  for (const std::string variant : {"llama", "qwen2"}) {
    SCOPED_TRACE(variant);
    const std::string dir = test::test_model_dir(variant);
    auto mbs = six_micro_batches(dir);
    for (const auto& mb : mbs) {  // every micro-batch has several chunks
      EXPECT_GT(loss_token_rows(mb.loss_mask).size(0), 2 * 3);
    }
    TrainerOptions o = zero_options();
    o.grpo.kl_coef = 0.05;
    // Adam's eps >> sqrt(v): the update is lr x the gradient's moment, so the weights differ as the
    // gradients do (sums in another order), not amplified where an entry is near 0.
    o.adam_eps = 1.0;
    o.schedule.lr = 0.05;
    Trainer whole(dir, o);
    o.logits_chunk_tokens = 3;
    Trainer chunked(dir, o);
    for (int s = 0; s < 3; ++s) {
      StepStats a = whole.train_step(mbs, LossKind::kGrpo);
      StepStats b = chunked.train_step(mbs, LossKind::kGrpo);
      EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm);
      EXPECT_NEAR(b.loss.loss, a.loss.loss, 1e-5 * std::abs(a.loss.loss) + 1e-7);
      EXPECT_NEAR(b.loss.kl, a.loss.kl, 1e-5 * a.loss.kl + 1e-7);
      EXPECT_NEAR(b.loss.entropy, a.loss.entropy, 1e-5 * a.loss.entropy);
    }
    auto wa = whole.master_weights(), wb = chunked.master_weights();
    for (size_t i = 0; i < wa.size(); ++i)
      test::expect_tensor_near(wb[i].second, wa[i].second, 1e-6);
  }
}

// Issue 55 item 1, ZeRO-3 on an 8-layer model: each rank holds 1/T of the parameters plus, at
// most, the embedding/norm/head group and two decoder layers (a layer's backward and the one
// before it overlap by a bucket); deterministic mode trains bit for bit as stage 2 (clipping on)
// and as stage 0 (clipping off: the norm's partial sums differ there), with activation
// checkpointing too, and a rank without micro-batches joins its peer's gathers.
struct StageThreeRun {
  std::vector<double> grad_norms;
  engine::NamedTensors weights;
  StateBytes bytes;
  int64_t prefetched = 0, prefetches_used = 0, collectives = 0;
};

StageThreeRun run_eight_layers(const std::vector<MicroBatch>& mbs, int stage, bool checkpointing,
                               double max_norm, bool rank1_idle = false, bool prefetch = true) {
  engine::ModelConfig c = engine::load_model_config(test::test_engine_config().model_dir);
  c.num_layers = 8;
  const engine::NamedTensors init = engine::random_init_weights(c, 11, at::kFloat);
  StageThreeRun out;
  auto errors = test::run_ranks(
      2, std::chrono::milliseconds(60000), [&](int r, auto& comm, const sync::StorePtr&) {
        TrainerOptions o = zero_options();
        o.group = comm.get();
        o.zero_stage = stage;
        o.deterministic = true;
        o.max_grad_norm = max_norm;
        o.activation_checkpointing = checkpointing;
        o.zero3_prefetch = prefetch;
        o.grad_bucket_bytes = 64 * 1024;
        engine::NamedTensors w;
        for (const auto& [name, t] : init) w.emplace_back(name, t.clone());
        Trainer t(c, std::move(w), o);
        for (int s = 0; s < 3; ++s) {
          t.zero_grad();
          const size_t mine = rank1_idle ? (r == 0 ? 2 : 0) : 1;
          for (size_t i = 0; i < 2; ++i) {
            if (i < mine) {
              t.accumulate(mbs[rank1_idle ? i : 2 * i + r], LossKind::kGrpo, 0.5, i + 1 == 2);
            } else {
              t.accumulate_empty();
            }
          }
          const StepStats st = t.finish_step();
          if (r == 0) out.grad_norms.push_back(st.grad_norm);
        }
        auto weights = t.master_weights(r == 0);
        if (r == 0) {
          out.weights = std::move(weights);
          out.bytes = t.state_bytes();
          out.prefetched = t.prefetched_buckets();
          out.prefetches_used = t.prefetches_used();
          out.collectives = comm->op_count();
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return out;
}

// Stage 0's norm sums whole buckets, the sharded stages' their slices: the same to fp32 rounding
// (a bucket's norm is an fp32 reduction).
void expect_bitwise(const StageThreeRun& a, const StageThreeRun& b, const std::string& what,
                    bool same_norm_sums = true) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.grad_norms.size(), b.grad_norms.size());
  for (size_t i = 0; i < a.grad_norms.size(); ++i) {
    if (same_norm_sums) {
      EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]);
    } else {
      EXPECT_NEAR(a.grad_norms[i], b.grad_norms[i], 1e-5 * b.grad_norms[i]);
    }
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_TRUE(at::equal(a.weights[i].second, b.weights[i].second)) << a.weights[i].first;
  }
}

TEST(ZeroTest, StageThreeGathersALayerAtATimeAndTrainsBitForBitAsStagesTwoAndZero) {
  auto mbs = six_micro_batches(test::test_engine_config().model_dir);
  const StageThreeRun z2 = run_eight_layers(mbs, 2, false, 0.5);
  const StageThreeRun z3 = run_eight_layers(mbs, 3, false, 0.5);
  const StageThreeRun z3_ckpt = run_eight_layers(mbs, 3, true, 0.5);
  const StageThreeRun z3_waiting = run_eight_layers(mbs, 3, false, 0.5, false, /*prefetch=*/false);
  expect_bitwise(z3, z2, "stage 3 vs stage 2");
  expect_bitwise(z3_ckpt, z2, "stage 3 with activation checkpointing vs stage 2");
  expect_bitwise(z3_waiting, z2, "stage 3 without the gather prefetch vs stage 2");
  // The next layer's gather starts while a layer computes, forward and backward (the first
  // layer's, and each layer's sharing a bucket with its neighbour, are not prefetched).
  EXPECT_GE(z3.prefetched, 3 * 2 * 4) << "3 steps x 2 micro-batches, at least 4 a micro-batch";
  EXPECT_EQ(z3.prefetches_used, z3.prefetched) << "a prefetched bucket was gathered again";
  EXPECT_EQ(z3.collectives, z3_waiting.collectives) << "the same gathers, only earlier";
  EXPECT_EQ(z3_waiting.prefetched, 0);
  EXPECT_GT(z2.grad_norms[0], 0.5) << "the test should exercise clipping";
  expect_bitwise(run_eight_layers(mbs, 3, false, 0), run_eight_layers(mbs, 0, false, 0),
                 "stage 3 vs stage 0, no clipping", /*same_norm_sums=*/false);

  engine::ModelConfig c = engine::load_model_config(test::test_engine_config().model_dir);
  c.num_layers = 8;
  int64_t root = 0, layer = 0, all = 0;
  for (const auto& spec : engine::model_param_specs(c)) {
    int64_t n = 4;  // fp32
    for (int64_t d : spec.shape) n *= d;
    all += n;
    if (spec.name.rfind("model.layers.0.", 0) == 0) layer += n;
    if (spec.name.rfind("model.layers.", 0) != 0) root += n;
  }
  ASSERT_LT(root, 2 * layer) << "the bound below would not tell one layer from all";
  const int64_t slack = 2 * 64 * 1024 + 64 * 4 * 2 * 40;  // bucket boundaries, slice padding
  for (const StageThreeRun* r : {&z3, &z3_ckpt, &z3_waiting}) {
    EXPECT_LE(r->bytes.parameters, all / 2 + root + 2 * layer + slack);
    EXPECT_GE(r->bytes.parameters, all / 2 + layer);
  }
  // The prefetch holds one layer more at most (and the buckets its two groups span).
  EXPECT_LE(z3.bytes.parameters, z3_waiting.bytes.parameters + layer + 2 * 64 * 1024);
  EXPECT_GE(z2.bytes.parameters, all);
}

TEST(ZeroTest, StageThreeRankWithoutMicroBatchesJoinsItsPeersGathers) {
  auto mbs = six_micro_batches(test::test_engine_config().model_dir);
  // Rank 0 trains two micro-batches, rank 1 runs two empty rounds: as stage 2 does, bit for bit.
  expect_bitwise(run_eight_layers(mbs, 3, false, 0.5, true),
                 run_eight_layers(mbs, 2, false, 0.5, true), "stage 3 vs stage 2, rank 1 idle");
}

TEST(ZeroTest, StageThreeRefusesLoraAndAKlReference) {
  auto refusal = [](const TrainerOptions& o) -> std::string {
    try {
      o.validate();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  TrainerOptions o;
  o.zero_stage = 3;
  o.lora.rank = 8;
  EXPECT_NE(refusal(o).find("LoRA trains an adapter"), std::string::npos) << refusal(o);
  o.lora.rank = 0;
  o.grpo.kl_coef = 0.1;
  EXPECT_NE(refusal(o).find("not with a KL reference"), std::string::npos) << refusal(o);
  o.grpo.kl_coef = 0;
  EXPECT_EQ(refusal(o), "");
}

TEST(ZeroTest, ARankWithoutMicroBatchesStillIssuesTheReductionsBeforeTheScaleCollective) {
  const std::string dir = test::test_engine_config().model_dir;
  auto mbs = six_micro_batches(dir);
  for (int stage : {0, 1}) {
    std::vector<double> norms(2);
    auto errors = test::run_ranks(
        2, std::chrono::milliseconds(20000), [&](int r, auto& comm, const sync::StorePtr&) {
          TrainerOptions o = zero_options();
          o.group = comm.get();
          o.zero_stage = stage;
          Trainer t(dir, o);
          // As the RL consumer's: a collective of its own inside finish_step.
          t.set_grad_scale([&] {
            at::Tensor n = at::ones({1}, at::kDouble);
            comm->all_reduce(n);
            return 1.0 / n.item<double>();
          });
          std::vector<MicroBatch> mine;
          if (r == 0) mine = {mbs[0], mbs[1]};  // rank 0 reduces from its last backward
          norms[r] = t.train_step(mine, LossKind::kGrpo).grad_norm;
        });
    for (const auto& e : errors) EXPECT_EQ(e, "") << "stage " << stage;
    EXPECT_EQ(norms[0], norms[1]) << "stage " << stage;
    EXPECT_GT(norms[0], 0.0);
  }
}

TEST(ZeroTest, ARankThatDiesBeforeTheReduceScatterEndsTheStepWithTheNamedError) {
  const std::string dir = test::test_engine_config().model_dir;
  auto mbs = six_micro_batches(dir);
  auto errors = test::run_ranks(2, std::chrono::milliseconds(3000),
                                [&](int r, auto& comm, const sync::StorePtr&) {
                                  TrainerOptions o = zero_options();
                                  o.group = comm.get();
                                  o.zero_stage = 2;
                                  Trainer t(dir, o);
                                  if (r == 1) return;  // dead: never reaches the step's collectives
                                  t.train_step({mbs[0]}, LossKind::kGrpo);
                                });
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[0].find("op=reduce_scatter group=world"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank=0/2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("bytes="), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace crl::trainer

// The memory plan (trainer/memory_plan.h): the trainer's state by ZeRO stage, dtype, LoRA and KL
// reference in bytes per parameter; per-device sums from the placement; the hand-over's peak; the
// refusal naming the device and its numbers.
#include "trainer/memory_plan.h"

#include <gtest/gtest.h>

#include "engine/model/model_cache.h"
#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

TrainerOptions trainer_options(const std::string& dtype, int zero) {
  TrainerOptions t;
  t.dtype = dtype;
  t.zero_stage = zero;
  t.grad_bucket_bytes = 0;  // no stage-2 bucket pool in the arithmetic below
  return t;
}

TEST(MemoryPlanTest, TrainerStateIsBytesPerParameterByStageDtypeAndSharding) {
  const engine::ModelConfig c = engine::preset_config("qwen2-0.5b");
  const int64_t p = c.num_params();
  // fp32 compute: parameters 4 (the masters themselves) + gradients 4 + Adam m, v 8.
  EXPECT_EQ(trainer_state_bytes(c, trainer_options("float32", 0), 1), 16 * p);
  // bf16 compute: parameters 2 + gradients 4 (fp32) + masters 4 + m, v 8.
  EXPECT_EQ(trainer_state_bytes(c, trainer_options("bfloat16", 0), 1), 18 * p);
  // ZeRO-1 over 4 ranks: masters and moments sharded.
  EXPECT_EQ(trainer_state_bytes(c, trainer_options("bfloat16", 1), 4), 2 * p + 4 * p + 12 * p / 4);
  // ZeRO-2 over 8: the gradients too.
  EXPECT_EQ(trainer_state_bytes(c, trainer_options("bfloat16", 2), 8), 2 * p + 16 * p / 8);
  // The default stage is 2 with more than one rank.
  EXPECT_EQ(trainer_state_bytes(c, trainer_options("bfloat16", -1), 8),
            trainer_state_bytes(c, trainer_options("bfloat16", 2), 8));
  // Offloaded optimizer state leaves the GPU.
  TrainerOptions off = trainer_options("bfloat16", 0);
  off.offload_optimizer = true;
  off.device = "cuda";
  EXPECT_EQ(trainer_state_bytes(c, off, 1), 2 * p + 4 * p);
  // A KL reference: one more copy in the compute dtype.
  TrainerOptions kl = trainer_options("float32", 0);
  kl.grpo.kl_coef = 0.01;
  EXPECT_EQ(trainer_state_bytes(c, kl, 1), 20 * p);
  // LoRA: the frozen base, and the adapter's own state (rank 8 on every linear layer).
  TrainerOptions lora = trainer_options("float32", 0);
  lora.lora.rank = 8;
  const int64_t h = c.hidden_size, kv = c.num_kv_heads * c.head_dim, i = c.intermediate_size;
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t a = 8 * c.num_layers * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h));
  EXPECT_EQ(trainer_state_bytes(c, lora, 1), 4 * p + 4 * a + 4 * a + 8 * a);
}

TEST(MemoryPlanTest, ActivationsShrinkWithCheckpointingAndGrowWithTheMicroBatch) {
  const engine::ModelConfig c = engine::preset_config("qwen2-0.5b");
  TrainerOptions t = trainer_options("bfloat16", 0);
  t.micro_batch_tokens = 1024;
  const int64_t full = activation_bytes(c, t);
  t.micro_batch_tokens = 2048;
  EXPECT_EQ(activation_bytes(c, t), 2 * full);
  t.activation_checkpointing = true;
  EXPECT_LT(activation_bytes(c, t), 2 * full);
  // The unchunked fp32 logits alone: tokens x vocabulary x 12 bytes.
  EXPECT_GT(activation_bytes(c, t), 2048 * c.vocab_size * 12);
}

RlOptions job(int n) {
  RlOptions o;
  o.infer_per_node = n;
  o.train_per_node = n;
  o.device = "cuda";
  o.cuda_device_count = n;
  o.engine_dtype = "bfloat16";
  o.trainer = trainer_options("bfloat16", -1);
  o.trainer.micro_batch_tokens = 4096;
  o.kv_memory_bytes = int64_t{20} << 30;
  o.max_staleness = 0;
  return o;
}

TEST(MemoryPlanTest, ColocatedPairsPutOneEngineAndOneTrainerOnEachGpu) {
  const engine::ModelConfig c = engine::preset_config("qwen2-0.5b");
  RlOptions o = job(4);
  const sync::Placement where =
      sync::plan_placement(sync::Topology{1, 4, 4}, o.placement_request());
  ASSERT_TRUE(where.topo.paired);
  o.kv_handover = true;
  const MemoryPlan plan = plan_memory(c, o, where);
  ASSERT_EQ(plan.devices.size(), 4u);
  const DeviceMemory& d = plan.devices[3];
  EXPECT_EQ(d.device, "cuda:3");
  EXPECT_EQ(d.engines, 1);
  EXPECT_EQ(d.trainers, 1);
  EXPECT_EQ(d.engine_weights, 2 * c.num_params());
  EXPECT_EQ(d.kv_pools, int64_t{20} << 30);
  // The trainers' ZeRO-2 bucket pool is the weight sync's bucket size, as the job gives it them.
  TrainerOptions as_run = o.trainer;
  as_run.grad_bucket_bytes = o.bucket_bytes;
  as_run.device = "cuda";
  EXPECT_EQ(d.trainer_state, trainer_state_bytes(c, as_run, 4));
  EXPECT_GT(d.trainer_state, trainer_state_bytes(c, o.trainer, 4));
  EXPECT_EQ(d.contexts, int64_t{1} << 30);
  // The KV pool and the activations take turns.
  const int64_t rest = d.engine_weights + d.trainer_state + d.contexts;
  EXPECT_EQ(d.peak(true), rest + std::max(d.kv_pools, d.activations));
  EXPECT_EQ(d.peak(false), rest + d.kv_pools + d.activations);
  const std::string table = plan.table({int64_t{141} << 30});
  EXPECT_NE(table.find("| cuda:0 | 1 engine, 1 trainer | "), std::string::npos) << table;
  EXPECT_NE(table.find("take turns (hand-over)"), std::string::npos) << table;
  EXPECT_NE(table.find("| 141.00 GiB |"), std::string::npos) << table;
  EXPECT_NE(table.find("| ? |"), std::string::npos) << table;  // devices 1-3: capacity unknown

  plan.check_fits({int64_t{141} << 30, 0, 0, 0});  // fits; unknown capacities are not checked
  ASSERT_THROWS_WITH(plan.check_fits({int64_t{16} << 30}), std::invalid_argument,
                     "memory plan: cuda:0 (1 engine, 1 trainer) needs about");
  ASSERT_THROWS_WITH(plan.check_fits({int64_t{16} << 30}), std::invalid_argument,
                     "but has 16.00 GiB: engine weights");
  ASSERT_THROWS_WITH(plan.check_fits({int64_t{16} << 30}), std::invalid_argument,
                     "Lower --kv-memory or --micro-batch-tokens");
}

// Two pairs on one GPU do not take turns with each other: one trainer may train while the other
// pair's engine still holds its pool, so the peak adds everything.
TEST(MemoryPlanTest, TwoPairsOnOneGpuCountEverythingAtOnce) {
  const engine::ModelConfig c = engine::preset_config("qwen2-0.5b");
  RlOptions o = job(2);
  o.cuda_device_count = 1;
  o.kv_handover = true;
  const MemoryPlan plan =
      plan_memory(c, o, sync::plan_placement(sync::Topology{1, 2, 2}, o.placement_request()));
  ASSERT_EQ(plan.devices.size(), 1u);
  const DeviceMemory& d = plan.devices[0];
  EXPECT_EQ(d.engines, 2);
  EXPECT_EQ(d.peak(true), d.peak(false));
}

TEST(MemoryPlanTest, TheCpuIsOneDeviceForEveryRank) {
  const engine::ModelConfig c = engine::preset_config("default");
  RlOptions o;
  o.infer_per_node = 2;
  o.train_per_node = 1;
  const MemoryPlan plan =
      plan_memory(c, o, sync::plan_placement(sync::Topology{1, 2, 1}, o.placement_request()));
  ASSERT_EQ(plan.devices.size(), 1u);
  EXPECT_EQ(plan.devices[0].device, "cpu");
  EXPECT_EQ(plan.devices[0].engines, 2);
  EXPECT_EQ(plan.devices[0].kv_pools, 2 * o.kv_memory_bytes);
  EXPECT_EQ(plan.devices[0].contexts, 0);
  const std::vector<int64_t> cap = device_capacities(plan);
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_GT(cap[0], int64_t{1} << 30);  // the host's memory
}

}  // namespace
}  // namespace crl::trainer

// The RL job (DESIGN.md §5): `colocated-rl --gpus-infer I --gpus-train T`, one rank's side.
//
// Infer ranks own an LlmEngine whose weights live in sync buckets; train ranks own a Trainer
// (fp32 masters, AdamW). Per GRPO step:
//   1. every rank draws the same global prompt list (seeded) and the infer ranks take their shard,
//      balanced by expected tokens; a prompt's n samples stay on one engine;
//   2. an infer rank scores each finished group, normalises its advantages, packs finished groups
//      into micro-batches as soon as a micro-batch is full and sends it to one of its node's
//      train ranks (round robin) over the node's sync group: metadata through the store, the
//      packed bytes as one send; nothing is padded, and a train rank holds one micro-batch;
//   3. train ranks accumulate gradients as micro-batches arrive, all-reduce over the train group,
//      step AdamW, and push the new weights (WeightSync: one broadcast per bucket, striped over
//      the node's train ranks) into the engines, which apply them between two steps;
//   4. world rank 0 prints a progress line from every rank's metrics (through the store), writes
//      the JSONL metrics file and, at the end, the summary table.
// An optional SFT warm-up runs first on the train ranks (data parallel, same all-reduce), and
// held-out accuracy is measured greedily by the engines at the start, every eval_every steps and at
// the end. Checkpoints (HF layout + optimizer state + data cursor) are written by the first train
// rank; --resume restarts from one.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "sync/dist_env.h"
#include "sync/weight_sync.h"
#include "trainer/tasks.h"
#include "trainer/trainer.h"

namespace crl::app {

struct RlJobOptions {
  int infer_per_node = 1;
  int train_per_node = 1;
  std::string model_dir;      // resolved
  std::string data_path;      // empty: the built-in default task
  trainer::RewardOptions reward;
  int64_t default_task_rows = 4000;
  int64_t eval_rows = -1;  // held-out rows; -1 = trainer::default_eval_rows
  uint64_t seed = 1;

  std::string engine_dtype = "float32";
  bool deterministic = false;
  int64_t kv_memory_bytes = int64_t{64} << 20;

  int64_t sft_steps = 100;
  int32_t sft_rows_per_step = 32;
  double sft_lr = 1e-3;

  int64_t steps = 60;
  int32_t prompts_per_step = 16;
  int32_t samples_per_prompt = 8;
  double temperature = 1.0;
  int32_t max_tokens = 12;
  trainer::TrainerOptions trainer;
  int64_t eval_every = 10;

  std::string metrics_path;
  std::string save_dir;
  int64_t save_every = 0;
  std::string resume_dir;

  // --serve-port: infer rank k serves the OpenAI API on port + k (0: any free port) during
  // training, its HTTP requests in the same continuous batch as the rollouts; -1: off.
  int serve_port = -1;
  std::string serve_host = "127.0.0.1";

  std::chrono::milliseconds timeout{300000};
  std::chrono::milliseconds rollout_timeout{1800000};
  int64_t bucket_bytes = int64_t{256} << 20;
  sync::WeightSyncOptions sync;
  // Tests only: "die-at-step:RANK:STEP" SIGKILLs that rank when it starts GRPO step STEP.
  std::string fault;
};

int run_rl_rank(const sync::RankEnv& env, const RlJobOptions& options);

}  // namespace crl::app

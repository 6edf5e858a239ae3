// run_local_rl: the whole RL loop in one process, no distributed runtime (DESIGN.md §5 with one
// infer "rank" and one train "rank" sharing a thread). It exists to measure that a task learns
// and to exercise every trainer piece end to end; the launcher will run the same steps across
// ranks with the communicator in place of the in-process weight copy.
//
// Flow: load an LlmEngine and a Trainer from the same model directory; optionally an SFT warm-up
// (teacher forcing on train rows, its own AdamW) whose weights start GRPO; then per GRPO step:
// generate n samples per prompt with the engine, score them, group-normalise advantages, pack
// micro-batches, one optimizer step, copy the trainer's weights into the engine in place and bump
// its weight version. Held-out accuracy (greedy) is measured before training, after the warm-up,
// every eval_every GRPO steps and at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/metrics.h"
#include "trainer/tasks.h"
#include "trainer/trainer.h"

namespace crl::trainer {

struct LocalRlOptions {
  // Hugging Face model directory; empty = the embedded default model (generated on first use).
  std::string model_dir;
  // Task rows from this JSONL file; empty = the built-in default task (default_task_rows).
  std::string data_path;
  // Rows generated for the default task.
  int64_t default_task_rows = 4000;
  // Reward used to score completions.
  RewardOptions reward;
  // Held-out rows: never trained on, all of them scored (greedy) at every evaluation.
  int64_t eval_rows = -1;  // held-out rows; -1 = trainer::default_eval_rows
  // Seed of the split, the prompt order and the sampling streams.
  uint64_t seed = 1;

  // Engine: compute dtype, batch-invariant mode (the trainer follows it), intra-op threads
  // (0 = leave libtorch's setting).
  std::string engine_dtype = "float32";
  bool deterministic = false;
  int32_t num_threads = 0;

  // SFT warm-up: optimizer steps, train rows per step, and the trainer settings of that stage.
  int64_t sft_steps = 0;
  int32_t sft_rows_per_step = 32;
  TrainerOptions sft_trainer;

  // GRPO: optimizer steps, prompts per step, samples per prompt, sampling temperature and the
  // generated-token cap.
  int64_t grpo_steps = 20;
  int32_t prompts_per_step = 16;
  int32_t samples_per_prompt = 8;
  double temperature = 1.0;
  int32_t max_tokens = 12;
  TrainerOptions trainer;
  // Evaluate held-out accuracy every this many GRPO steps (0 = only before and after).
  int64_t eval_every = 5;

  // Optional outputs: JSONL metrics file, final checkpoint directory, progress-line sink.
  std::string metrics_path;
  std::string checkpoint_dir;
  std::function<void(const std::string&)> log;
};

struct EvalPoint {
  std::string phase;       // "start", "sft", "grpo"
  int64_t step = 0;        // optimizer steps of that phase so far
  double accuracy = 0;     // held-out, greedy
  double elapsed_s = 0;    // since the run started
};

struct LocalRlResult {
  std::vector<EvalPoint> evals;
  std::vector<StepMetrics> sft_steps;
  std::vector<StepMetrics> grpo_steps;
  double wall_seconds = 0;
  double sft_seconds = 0;
  double grpo_seconds = 0;
};

LocalRlResult run_local_rl(const LocalRlOptions& options);

}  // namespace crl::trainer

// The train command's flags, shared by `colocated-rl plan` (cmd_plan.cpp), which takes the same
// model, schedule, RL, LoRA and distributed flags to plan a job's memory.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "app/rl_job.h"
#include "app/sync_flags.h"

namespace crl::app {

struct TrainFlags {
  // GRPO's recipe for single-turn full fine-tuning (docs/rl-job.md): 110 steps at 2e-4.
  TrainFlags() { o.steps = 110; }
  RlJobOptions o;
  DistFlags dist;
  std::string kv_memory = "64MiB";
  std::string reward = "exact";
  std::string answer_extract = "first-line";
  double reward_timeout_s = 30;
  CLI::Option* extract_opt = nullptr;
  std::string train_dtype;
  double lr = 2e-4;
  double rollout_timeout_s = 1800;
  double env_timeout_s = 30;
  double min_lr = -1;      // unset: lr / 10
  double sft_min_lr = -1;  // unset: sft lr / 10
  std::string inflight = "keep";
  std::string device_map;
  // Given on the command line (else --lora-rank picks its own defaults).
  CLI::Option *sft_lr_opt = nullptr, *sft_steps_opt = nullptr, *temperature_opt = nullptr;
  CLI::Option *lr_opt = nullptr, *sft_target_opt = nullptr, *steps_opt = nullptr,
              *warmup_opt = nullptr, *staleness_opt = nullptr, *max_tokens_opt = nullptr;
  std::string sft_target = "demonstration";
  std::string sft_trains = "auto";
};

// The flag groups, in the order --help shows them (cmd_train.cpp).
void add_model_and_task_flags(CLI::App* cmd, TrainFlags* f);
void add_schedule_flags(CLI::App* cmd, TrainFlags* f);
void add_rl_flags(CLI::App* cmd, TrainFlags* f);
void add_lora_flags(CLI::App* cmd, TrainFlags* f);
void add_env_flags(CLI::App* cmd, TrainFlags* f);
void add_output_flags(CLI::App* cmd, TrainFlags* f);

}  // namespace crl::app

// The RL job's shared state (docs/design.md §5), one object per part: the options (RlOptions), this
// rank's place (RlRanks), the version arithmetic every rank agrees on (VersionPlan), the task and
// its data cursor (TaskData) and the control plane (sync::Coordinator). Each rank runs one role:
// RolloutProducer (infer ranks), RolloutConsumer (train ranks); world rank 0 also runs
// report_rl_job.
//
// Weight versions: the engines start at `first_version` (the checkpoint's step on resume, else
// 0); an SFT warm-up sends one version; GRPO step s trains on weights version_at(s) and sends
// version_at(s) + 1. With --max-staleness K the engines generate step s's rollouts once they hold
// version_at(s) - K (K = 0: exactly the weights the step trains, the synchronous loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "engine/model/config.h"
#include "sync/coordinator.h"
#include "sync/dist_env.h"
#include "sync/groups.h"
#include "sync/placement.h"
#include "sync/weight_sync.h"
#include "trainer/environment.h"
#include "trainer/multi_turn.h"
#include "trainer/tasks.h"
#include "trainer/traces.h"
#include "trainer/trainer.h"

namespace crl::trainer {

struct RlOptions {
  int infer_per_node = 1;
  int train_per_node = 1;
  std::string model_dir;              // resolved
  std::string data_path;              // empty: the built-in default task
  bool split_special_tokens = false;  // --data is untrusted: special-token literals stay text
  trainer::RewardOptions reward;
  int64_t default_task_rows = 4000;
  int64_t eval_rows = -1;  // held-out rows; -1 = trainer::default_eval_rows
  uint64_t seed = 1;

  // Where the ranks run (sync/placement.h): --device cpu|cuda; --device-map, the GPU of each
  // local rank (infer ranks first; empty: local rank mod cuda_device_count).
  std::string device = "cpu";
  std::vector<int> device_map;
  // CUDA devices visible on this node: the app counts them (0 on a build without CUDA).
  int cuda_device_count = 0;
  // --comm-backend: auto (NCCL where a group's members sit on distinct GPUs), gloo or nccl.
  std::string comm_backend = "auto";
  // --colocate: auto, on or off (sync/placement.h): each engine fed by the trainer beside it.
  std::string colocate = "auto";
  // The colocated hand-over (docs/design.md §5): set by the app where the engines and trainers are
  // paired, the schedule synchronous (K = 0) and no API server shares the engines. Each engine then
  // frees its KV pool once its rollouts of a step are in and takes it back with its next work; its
  // trainer starts the step's forward/backward only after that, and returns its cached device
  // memory before it sends the new weights.
  bool kv_handover = false;

  // --infer-tp: each engine (infer rank) a tensor-parallel group of this many ranks, threads of its
  // process (on CUDA: GPUs i*N .., sync/placement.h). On the CPU each rank's shard lives in sync
  // buckets of its own, fed over a sync lane of its own (rl_sync_lanes); on GPUs the trainers send
  // the whole model's buckets to each engine's leader, which lands every rank's slices
  // (engine::TpWeightLanding).
  int infer_tp = 1;
  std::string engine_dtype = "float32";
  bool deterministic = false;
  std::string cpu_kernels = "auto";  // the engines' CPU linear layers (EngineConfig::cpu_kernels)
  int64_t kv_memory_bytes = int64_t{64} << 20;

  // The SFT warm-up (the recipe of issue 24: the copy task's SFT transition comes at 100-130
  // steps at this lr, so 200 steps with a decaying rate end past it, settled, on every seed; on
  // the shuffled demonstrations of issue 50, 150 steps left the format unlearned on 2 seeds of 2).
  int64_t sft_steps = 200;
  int32_t sft_rows_per_step = 32;
  // true: the warm-up trains on each row's answer; false: on its demonstration when it has one
  // (TaskRow::demonstration: the built-in task's show the format only, leaving GRPO the task).
  bool sft_on_answers = false;
  // With LoRA: true, the warm-up trains the whole model, which then is the frozen base that GRPO's
  // adapter adapts (the engines receive the warmed-up base once, then the adapter's versions);
  // false, the warm-up trains the adapter alone (app/cmd_train.cpp: --sft-trains).
  bool sft_trains_model = false;
  // Its schedule: linear warmup to lr, then cosine down to min_lr at the end of the warm-up
  // (total_steps is taken from sft_steps).
  trainer::LrSchedule sft_schedule{1e-3, 10, 0, 1e-4};

  int64_t steps = 90;  // the CLI's default is 110 (90 with --env, 60 with LoRA): app/cmd_train.cpp
  int32_t prompts_per_step = 16;
  int32_t samples_per_prompt = 8;
  double temperature = 1.0;
  int32_t max_tokens = 12;
  trainer::TrainerOptions trainer;
  // PPO mini-batches and epochs (verl's ppo_mini_batch_size, as a count, and ppo_epochs): each
  // GRPO step's rollouts trained in this many optimizer updates (its sequences in order, split
  // evenly), the whole pass made this many times, all at the step's learning rate. After the
  // first update the trainer's policy has moved from the one that sampled, so the PPO clip acts
  // even at --max-staleness 0. 1 and 1 (the default): one update a step, each micro-batch trained
  // as it arrives; otherwise a train rank holds its step's micro-batches until they are all in.
  int32_t ppo_mini_batches = 1;
  int32_t ppo_epochs = 1;
  int64_t eval_every = 10;

  std::string metrics_path;
  // --traces FILE, --trace-rate R: the rollout samples of (a share of) the groups, one JSON line
  // each (trainer/traces.h); traces.seed is --seed.
  TraceOptions traces;
  // --verbose: each GRPO step's full line (throughput, timings, staleness, importance weights,
  // idle shares) instead of the short one (format_step_line).
  bool verbose = false;
  // TensorBoard event files go here (empty: none): every number of each GRPO step's --metrics row
  // under its name there (metrics_file_row), the start and after-warm-up evaluations as eval/*,
  // and (the first train rank's own event file, in DIR/sft) each SFT warm-up step as sft/loss,
  // sft/grad_norm, sft/lr.
  std::string tensorboard_dir;
  std::string save_dir;
  int64_t save_every = 0;
  std::string resume_dir;
  bool save_merged =
      false;  // LoRA: each checkpoint also holds merged/, the base with the adapter merged

  // --serve-port: infer rank k serves the OpenAI API on port + k (0: any free port) during
  // training, its HTTP requests in the same continuous batch as the rollouts; -1: off.
  int serve_port = -1;
  std::string serve_host = "127.0.0.1";
  std::string serve_api_key;  // "": the API is open (see server::ServerOptions::api_key)

  std::chrono::milliseconds timeout{300000};
  std::chrono::milliseconds rollout_timeout{1800000};
  int64_t bucket_bytes = int64_t{256} << 20;
  sync::WeightSyncOptions sync;
  // Asynchronous RL: engines generate step s's rollouts once they hold weights no older than
  // (the trainer's version at step s) - K, so they keep generating while the trainers train;
  // 0 = the synchronous loop. A group with a token older than that is dropped and counted.
  int64_t max_staleness = 1;
  // --reproducible: no result depends on timing. Engines take new weights only between two RL
  // steps' rollouts (step s is sampled entirely by version max(version_at(s) - K,
  // first_grpo_version()); by default a version lands between any two engine steps, as soon as it
  // is sent), groups are packed in prompt order and train ranks take micro-batches from their
  // infer ranks in turn. Costs the overlap of a step's generation with its training at K >= 1.
  bool reproducible = false;
  // What an engine does to its running sequences when a new version lands between two steps.
  engine::InflightPolicy inflight = engine::InflightPolicy::kKeep;
  // Packed micro-batches an infer rank queues for its train ranks before it stops admitting
  // new prompts (back-pressure).
  size_t rollout_queue = 4;
  // Multi-turn RL (issue 28): --env "calculator" (built in) or a command speaking JSON lines
  // (trainer/environment.h); "" = the single-turn job. A GRPO group is --n-samples episodes of one
  // task (the task rows' index is the environment's task index); --max-tokens caps each assistant
  // turn. The SFT warm-up runs on the environment's demonstrations (an external environment has
  // none: --sft-steps 0).
  std::string env;
  trainer::MultiTurnOptions multi_turn;
  trainer::EnvOptions env_options;
  // Tests only: "die-at-step:RANK:STEP" SIGKILLs that rank when it starts GRPO step STEP.
  std::string fault;

  // Checks the options against each other (throws std::invalid_argument naming the flags). The
  // RL job syncs in bucket mode only: the per-tensor and
  // raw modes are benchmark baselines (`colocated-rl bench sync`). The placement is planned here
  // too (--device, --device-map, --comm-backend; --device cuda without a CUDA device, and
  // --deterministic on CUDA, are errors), so the launcher refuses a bad one before any rank starts.
  void validate();
  // --infer-tp's own refusals (validate() calls it without a model); with `model`, also that its
  // heads, KV heads and MLP divide by it. std::invalid_argument naming the flags.
  void check_infer_tp(const engine::ModelConfig* model) const;
  // The placement request these options make (sync/placement.h).
  sync::PlacementRequest placement_request() const;
};

// This rank's place in the job: its environment, its groups and its index among the ranks of its
// role. Fixed once the world is joined.
struct RlRanks {
  sync::RankEnv env;
  // Every rank's device and group backends, and this rank's share (its device: the engine's on an
  // infer rank, the trainer's on a train rank).
  sync::Placement placement;
  sync::RankPlacement self;
  sync::Groups g;
  int infer_total = 0, train_total = 0;
  int role_global = 0;  // index among all infer (or all train) ranks
};

// Plans the placement, makes this rank's CUDA device current when it joins an NCCL group, and
// splits the world into the groups with the placement's backends. Collective over the world.
// `make_own` stands in for the NCCL group factory (tests: Gloo groups on CPU); see make_groups.
RlRanks make_rl_ranks(sync::World& world, const RlOptions& o,
                      const sync::CommFactory& make_own = nullptr);

// The weight sync's options for this rank: --sync-* with the device its buckets live on (the
// engine's or the trainer's), so WeightSync picks CUDA IPC where a sync_root group shares a GPU.
sync::WeightSyncOptions rl_sync_options(const RlOptions& o, const sync::RankPlacement& self);
// The weight sync's tensor-parallel lanes: --infer-tp where the groups have a lane per engine rank
// (sync/placement.h decides), else 1 (the leader stages the whole buckets).
int rl_sync_lanes(const RlOptions& o, const sync::Groups& g);
// A placement with NCCL groups needs libnccl and libcudart at run time: refused in the launcher
// rather than by every rank at its first NCCL group.
void check_nccl_usable(const RlOptions& o);
// Colocated pairs sharing a GPU (or --colocate on on the CPU) take turns: max_staleness 0 unless
// it was given, and kv_handover (not while an API server shares the engines).
void resolve_colocated_schedule(const sync::Placement& where, bool staleness_given, RlOptions* o);
// A LoRA run whose warm-up trains the whole model (RlOptions::sft_trains_model) hands the
// engines the warmed-up base once, before the adapter's first version: the whole model's layout
// (engine::model_param_specs order, the engines' dtype), synced under the scope "base".
bool hands_over_warmed_base(const RlOptions& o, bool runs_sft);
sync::WeightLayout warmed_base_layout(const engine::ModelConfig& config, const RlOptions& o);

// The weight-version arithmetic every rank agrees on (see the top of this file): a value, computed
// from the options and the step the job starts at, the same on every rank.
class VersionPlan {
 public:
  VersionPlan(const RlOptions& o, int64_t start_step, bool resumed)
      : start_step_(start_step),
        resumed_(resumed),
        sft_(!resumed && o.sft_steps > 0),
        steps_(o.steps),
        eval_every_(o.eval_every),
        max_staleness_(o.max_staleness) {}

  int64_t start_step() const { return start_step_; }
  bool resumed() const { return resumed_; }
  bool runs_sft() const { return sft_; }
  // Weights the engines hold before GRPO step start_step (after the SFT warm-up).
  int64_t first_grpo_version() const { return start_step_ + (sft_ ? 1 : 0); }
  // Weights GRPO step s trains on; it sends version_at(s) + 1.
  int64_t version_at(int64_t step) const { return first_grpo_version() + step - start_step_; }
  int64_t final_version() const { return version_at(steps_); }
  // The oldest weights a token step s trains on may come from (--max-staleness K behind
  // version_at(s)): the engines wait for it before they sample the step, drop a group with an older
  // token, and the train ranks refuse one.
  int64_t oldest_allowed(int64_t step) const { return version_at(step) - max_staleness_; }
  // The step whose end version `v` is (v = version_at(s) + 1), or a step before start_step for
  // the SFT version.
  int64_t step_of_version(int64_t v) const { return v - 1 - first_grpo_version() + start_step_; }
  // Held-out evaluation after step s.
  bool evaluates_after(int64_t step) const {
    return (eval_every_ > 0 && (step + 1) % eval_every_ == 0) || step + 1 == steps_;
  }

 private:
  int64_t start_step_;
  bool resumed_, sft_;
  int64_t steps_, eval_every_, max_staleness_;
};

// The task's rows (training and held-out) and the data cursor: every rank draws the same rows in
// the same order, so each draws its copy for every step, whether it uses the rows or not.
class TaskData {
 public:
  // Loads the task (--data, or the built-in default) and skips `rows_drawn` rows (--resume).
  TaskData(const RlOptions& o, int64_t rows_drawn);
  const TaskSplit& split() const { return split_; }
  std::vector<int64_t> draw(int64_t count);
  int64_t drawn() const { return rows_->drawn(); }

 private:
  TaskSplit split_;
  std::unique_ptr<RowSampler> rows_;
};

// The RL job's shared state, as the objects that own each part: the options, this rank's place,
// the version plan, the task data and the control plane.
struct RlContext {
  // Joins the world, splits the groups, loads the task and, with --resume, the data cursor.
  RlContext(const sync::RankEnv& env, const RlOptions& options);

  const RlOptions& o;
  // The RL job's control plane over the world store (keys under "rl/").
  std::unique_ptr<sync::Coordinator> coord;
  RlRanks ranks;
  VersionPlan versions;
  TaskData data;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  sync::Clock::time_point rollout_deadline() const {
    return sync::Clock::now() + o.rollout_timeout;
  }
  // A coordinator over a store connection of this rank's own (for a second thread).
  std::unique_ptr<sync::Coordinator> connect_own_coordinator() const;

 private:
  // Where the job starts: the checkpoint's step and data cursor with --resume, else the start.
  struct Start {
    int64_t step = 0;
    int64_t rows_drawn = 0;
    bool resumed = false;
  };
  static Start read_start(const RlOptions& o);
  RlContext(sync::World world, const RlOptions& options, const Start& start);
};

// The warmed-up base's WeightSync (hands_over_warmed_base): `layout` under the scope "base", made
// by the train and infer ranks at start as the job's own WeightSync is.
std::unique_ptr<sync::WeightSync> warmed_base_sync(RlContext& c, const sync::WeightLayout& layout);

// Tests only: --inject-fault die-at-step:RANK:STEP (the rank kills itself at that step), or
// hold-kv:RANK (that infer rank never hands its KV pool over in the colocated mode).
struct Fault {
  std::string kind;  // "die-at-step", "hold-kv" or "" (none)
  int rank = -1;
  int64_t step = -1;
};
Fault parse_fault(const std::string& s);

// The colocated hand-over's control-plane key (RlOptions::kv_handover): set by infer rank `i` of
// `node` once its KV pool is released before phase `phase` trains ("sft", or "s<step>").
std::string kv_released_key(int node, const std::string& phase, int i);
std::string handover_phase(int64_t step);  // "s<step>"; the warm-up's is "sft"

}  // namespace crl::trainer

// RolloutConsumer: the train rank's side of the RL step (docs/design.md §5 steps 3-5).
//
// Owns a Trainer (fp32 masters, AdamW) and, after an optional SFT warm-up (data parallel, the
// same all-reduce), per GRPO step s:
//   1. receives the step's packed micro-batches from its node's infer ranks (RolloutReceiver) as
//      they come, accumulating gradients one micro-batch at a time (a train rank holds one; with
//      ZeRO stage 2 the few waiting for their collective round), and checks that no loss token
//      is older than version_at(s) - K (the staleness invariant);
//   2. waits until every node's rollouts are in (a store barrier), reduces gradients over the
//      train group, steps AdamW;
//   3. sends version_at(s) + 1 to its node's engines (WeightSync: one broadcast per bucket,
//      striped over the node's train ranks; paired, every bucket to the engine beside it) once
//      they asked for it, and writes a checkpoint when due (the first train rank; HF layout +
//      optimizer + data cursor).
// In the colocated hand-over (RlOptions::kv_handover, synchronous steps) step 1 starts only once
// the engine beside this trainer freed its KV pool, and the trainer returns its cached device
// memory after the optimizer step, before it sends the weights the engine waits for.
// Each step's TrainReport (step_reports.h) goes to world rank 0 through the coordinator.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trainer/micro_batch.h"
#include "trainer/rl_context.h"

namespace crl::sync {
class RolloutReceiver;
class WeightLayout;
class WeightSync;
}  // namespace crl::sync

namespace crl::trainer {

struct TrainReport;

// ZeRO stage 2 in the RL step: every micro-batch is a collective round and train ranks receive
// different numbers of micro-batches, as they come. Round i (1-based) runs once some rank has an
// i-th micro-batch and every rank has one or has ended its stream (it then runs an empty round).
// So rounds run while rollouts stream in, and no rank enters a round's collectives while a peer
// still waits on generation for it: the collective deadline never covers generation.
// Ranks count in the coordinator's counters, so a look costs three requests whatever the number of
// ranks:
//   have(i)  ranks that received an i-th micro-batch (each adds 1 as it does)
//   ended    ranks whose stream ended
//   ended(i) ended ranks that received an i-th micro-batch (a rank adds 1 to ended(1..n) before
//            `ended`, so a reader that reads `ended` first never counts a rank twice)
// Round i may run when have(i) >= 1 and have(i) + ended - ended(i) == ranks.
bool round_runnable(int64_t have_i, int64_t ended, int64_t ended_i, int64_t ranks);

// The trainer of train rank `self`: the options' trainer settings on the placement's device,
// reducing over `train_group`, its buckets the weight sync's (same cap).
TrainerOptions rollout_trainer_options(const RlOptions& o, const sync::RankPlacement& self,
                                       sync::Communicator* train_group);

class RolloutConsumer {
 public:
  explicit RolloutConsumer(RlContext& ctx);
  ~RolloutConsumer();
  RolloutConsumer(const RolloutConsumer&) = delete;
  RolloutConsumer& operator=(const RolloutConsumer&) = delete;

  void run();

 private:
  GradScale grad_scale();
  // Where the small tensors this class reduces over the train group live (see the .cpp).
  at::TensorOptions train_group_options() const;
  // Runs `batches` through accumulate(); with ZeRO stage 2 in rounds padded to the group's largest
  // count (each round is a collective). Returns their loss metrics.
  // The token mean of `parts`' losses over every train rank (a collective of the train group
  // when it has more than one rank).
  double group_token_mean(const std::vector<LossMetrics>& parts) const;
  std::vector<LossMetrics> accumulate_all(Trainer& tr, const std::vector<MicroBatch>& batches,
                                          LossKind kind);
  // Stage-2 rounds of the step in progress (see round_runnable).
  struct Rounds {
    int64_t step = 0;
    std::deque<MicroBatch> held;  // received, not trained yet
    int64_t received = 0, done = 0;
    bool ended = false;
    int64_t while_receiving = 0;  // rounds run before this rank's stream ended
    int64_t ended_ranks = 0;      // at the last look
    sync::Clock::time_point next_look{};
    std::chrono::microseconds pause{100};
  };
  // Counts a received micro-batch (or, with `ended`, the end of this rank's stream) in the store.
  void count_round(Rounds& r, bool ended);
  // Trains every round runnable now. Returns true once every rank ended and every round ran.
  bool run_rounds(Trainer& tr, Rounds& r, std::vector<LossMetrics>& parts);
  void barrier(const std::string& name);
  double send(Trainer& tr, int64_t version);
  // Sends warmed_base_ to the engines (scope "base"), then lets it go; with --save-dir first
  // writes it as DIR/base (base_dir_), the base every later checkpoint names.
  void send_warmed_base(Trainer& tr, int64_t version);
  // Writes DIR/step-N (all train ranks; the group's rank 0 writes) and returns the directory.
  std::string checkpoint(Trainer& tr, int64_t step, const char* phase);
  std::unique_ptr<Trainer> sft(std::unique_ptr<Trainer> tr, const TrainerOptions& topts);
  TrainReport train_step(Trainer& tr, int64_t step);
  // PPO mini-batches and epochs (RlOptions::ppo_mini_batches, ppo_epochs) over the step's `held`
  // micro-batches, once every rank has its own: an optimizer update per mini-batch some rank has
  // loss tokens in, the learning rate advancing after the last. Appends every update's metrics to
  // `parts`. Returns the last update's.
  struct UpdatesReport {
    LossMetrics before;       // the first update's metrics, before the policy moved
    int64_t loss_tokens = 0;  // this rank's loss tokens of the step, counted once
    int64_t updates = 0;      // optimizer updates made
  };
  StepStats run_updates(Trainer& tr, const std::vector<MicroBatch>& held,
                        std::vector<LossMetrics>& parts, UpdatesReport* out);
  // The colocated hand-over (RlOptions::kv_handover): waits until the engine beside this trainer
  // freed its KV pool before `phase` trains (throws naming it at --rollout-timeout), and returns
  // the seconds waited; release_device_memory() hands the trainer's cached device memory back
  // before the engine needs it again, and returns the seconds it took.
  double wait_kv_released(const std::string& phase);
  double release_device_memory();
  // Fails the step when a loss token of `mb` was sampled by weights newer than the step trains or
  // older than VersionPlan::oldest_allowed; adds the tokens' staleness to *sum and *max.
  void check_staleness(const MicroBatch& mb, int64_t step, int64_t* sum, int64_t* max) const;
  // ZeRO-2: the store counters of a finished step's rounds (train rank 0, after the barrier).
  void remove_round_counters(const Rounds& rd);

  RlContext& c_;
  const RlOptions& o_;
  std::unique_ptr<sync::WeightLayout> layout_;
  std::unique_ptr<sync::WeightSync> ws_;
  // A LoRA run's whole-model warm-up (hands_over_warmed_base): its weights, sent once.
  std::unique_ptr<sync::WeightLayout> base_layout_;
  std::unique_ptr<sync::WeightSync> base_ws_;
  engine::NamedTensors warmed_base_;
  std::string base_dir_;
  std::unique_ptr<sync::RolloutReceiver> receiver_;
  int64_t local_loss_tokens_ = 0;
  std::string last_barrier_;
};

}  // namespace crl::trainer

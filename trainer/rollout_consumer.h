// RolloutConsumer: the train rank's side of the RL step (DESIGN.md §5 steps 3-5).
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
//      striped over the node's train ranks) once they asked for it, and writes a checkpoint when
//      due (the first train rank; HF layout + optimizer + data cursor).
// Metrics of each step go to the store for world rank 0.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/micro_batch.h"
#include "trainer/rl_context.h"

namespace crl::sync {
class RolloutReceiver;
class WeightLayout;
class WeightSync;
}  // namespace crl::sync

namespace crl::trainer {

// ZeRO stage 2 in the RL step: every micro-batch is a collective round and train ranks receive
// different numbers of micro-batches, as they come. Each rank publishes (in the store) how many
// of the step's micro-batches it received and whether its stream ended; round i (1-based) runs
// once some rank has an i-th micro-batch and every rank has one or has ended (it then runs an
// empty round). So rounds run while rollouts stream in, and no rank enters a round's collectives
// while a peer still waits on generation for it: the collective deadline never covers generation.
struct RoundProgress {
  int64_t received = 0;
  bool ended = false;
};
// Rounds that may run now (all of them, up to the largest count, once every rank ended).
int64_t runnable_rounds(const std::vector<RoundProgress>& ranks);

class RolloutConsumer {
 public:
  explicit RolloutConsumer(RlContext& ctx);
  ~RolloutConsumer();
  RolloutConsumer(const RolloutConsumer&) = delete;
  RolloutConsumer& operator=(const RolloutConsumer&) = delete;

  void run();

 private:
  GradScale grad_scale();
  // Runs `batches` through accumulate(); with ZeRO stage 2 in rounds padded to the group's largest
  // count (each round is a collective). Returns their loss metrics.
  std::vector<LossMetrics> accumulate_all(Trainer& tr, const std::vector<MicroBatch>& batches,
                                          LossKind kind);
  // Stage-2 rounds of the step in progress (see RoundProgress).
  struct Rounds {
    int64_t step = 0;
    std::deque<MicroBatch> held;  // received, not trained yet
    int64_t received = 0, done = 0;
    int64_t streamed = 0;  // rounds run before this rank's stream ended
    bool ended = false;
    std::vector<int> open;  // train ranks whose stream had not ended at the last look
  };
  void announce(const Rounds& r);
  // Trains every round runnable now; returns whether every rank ended and every round ran.
  bool run_rounds(Trainer& tr, Rounds& r, std::vector<LossMetrics>& parts);
  void barrier(const std::string& name);
  double send(Trainer& tr, int64_t version);
  std::unique_ptr<Trainer> sft(std::unique_ptr<Trainer> tr, const TrainerOptions& topts);
  nlohmann::json train_step(Trainer& tr, int64_t step);

  RlContext& c_;
  const RlOptions& o_;
  std::unique_ptr<sync::WeightLayout> layout_;
  std::unique_ptr<sync::WeightSync> ws_;
  std::unique_ptr<sync::RolloutReceiver> receiver_;
  int64_t local_loss_tokens_ = 0;
  std::string last_barrier_;
};

}  // namespace crl::trainer

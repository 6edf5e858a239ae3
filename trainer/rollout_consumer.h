// RolloutConsumer: the train rank's side of the RL step (DESIGN.md §5 steps 3-5).
//
// Owns a Trainer (fp32 masters, AdamW) and, after an optional SFT warm-up (data parallel, the
// same all-reduce), per GRPO step s:
//   1. receives the step's packed micro-batches from its node's infer ranks (RolloutReceiver) as
//      they come, accumulating gradients one micro-batch at a time (a train rank holds one), and
//      checks that no loss token is older than version_at(s) - K (the staleness invariant);
//   2. waits until every node's rollouts are in (a store barrier), all-reduces gradients over the
//      train group, steps AdamW;
//   3. sends version_at(s) + 1 to its node's engines (WeightSync: one broadcast per bucket,
//      striped over the node's train ranks) once they asked for it, and writes a checkpoint when
//      due (the first train rank; HF layout + optimizer + data cursor).
// Metrics of each step go to the store for world rank 0.
//
// Thread safety: one thread.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/rl_context.h"

namespace crl::sync {
class RolloutReceiver;
class WeightLayout;
class WeightSync;
}  // namespace crl::sync

namespace crl::trainer {

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

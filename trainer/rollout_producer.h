// RolloutProducer: the infer rank's side of the RL step (docs/design.md §5 steps 1-2 and 5).
//
// Owns an LlmEngine (weights in sync buckets) stepped by an EngineLoop, which also serves the
// OpenAI API with --serve-port, in the same continuous batch. Per GRPO step s:
//   1. waits until the engine holds weights version_at(s) - K (K = --max-staleness), then draws
//      the step's prompts (the same on every rank), takes its shard (balanced by expected tokens;
//      a prompt's n samples stay on one engine) and submits it;
//   2. as each group finishes: scores it, records the weight version of every token, and hands it
//      to a RolloutBatcher, which drops it (counted) when a token is older than
//      VersionPlan::oldest_allowed(s) = version_at(s) - K, normalises its advantages, and queues
//      full packed micro-batches to the node's train ranks (RolloutSender);
//   3. all the while, the engine loop takes each new weight version between two engine steps as
//      soon as the train ranks send it (--inflight-update decides what happens to running
//      sequences; the producer only asks for versions and evaluates them), and when the rollout
//      queue is full it waits before it admits more.
//      With --reproducible it takes versions only in step 1 (exactly version_at(s) - K, asked
//      for there, or the newer first GRPO version in the first K steps) and packs groups in
//      prompt order, so the weights that sampled a token and the
//      micro-batches are functions of the step count, not of timing; its rollout queue is then
//      unbounded (at most K + 1 steps' rollouts).
// With --env the rollouts are multi-turn episodes against an environment (multi_turn.h;
// rollout_episodes.cpp): a group is n episodes of one task, its advantages come from the episodes'
// rewards, and each episode is one sample per prefix-preserving segment, its tool/environment
// tokens with loss weight 0.
// Held-out accuracy is measured greedily on the version that ends an evaluated step, before the
// engine asks for the next one. Each step's InferReport (step_reports.h) and the evaluations go to
// world rank 0 through the coordinator.
//
// Thread safety: one thread calls run(); the engine thread and the sender's thread are its own.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "trainer/micro_batch.h"
#include "trainer/rl_context.h"

namespace crl::engine {
class EngineLoop;
struct GenerateRequest;
struct RequestOutput;
}  // namespace crl::engine
namespace crl::text {
class ChatTemplate;
}
namespace crl::sync {
class RolloutSender;
class WeightLayout;
class WeightSync;
}  // namespace crl::sync

namespace crl::trainer {

class PromptEncoder;
class TraceWriter;
class RolloutBatcher;
class Environment;
class EpisodeRunner;
class Rewarder;
struct InferReport;

// The engine of infer rank `self`: the options' model (the checkpoint's when `resumed`), dtype,
// kernels and KV pool, on the placement's device.
engine::EngineConfig rollout_engine_config(const RlOptions& o, const sync::RankPlacement& self,
                                           bool resumed);

class RolloutProducer {
 public:
  explicit RolloutProducer(RlContext& ctx);
  ~RolloutProducer();
  RolloutProducer(const RolloutProducer&) = delete;
  RolloutProducer& operator=(const RolloutProducer&) = delete;

  void run();

  // The engine thread: the app puts the API server over it with --serve-port (trainer/ does not
  // depend on server/).
  std::shared_ptr<engine::EngineLoop> engine_loop() const { return loop_; }

 private:
  double evaluate();
  // Submits `reqs` and calls on_finished(index, output) as each finishes (with in_order, in
  // index order: an output waits for every earlier one); meanwhile, with follow, follows up every
  // weight version the engine takes. A failed request fails the step. Returns the seconds the
  // requests were in flight.
  double run_requests(std::vector<engine::GenerateRequest> reqs, bool follow, bool in_order,
                      const std::function<void(size_t, const engine::RequestOutput&)>& on_finished);
  // Follows up every version the engine took since the last call (after_update); true when any.
  // Throws when the engine's weight update failed.
  bool follow_updates();
  // What follows the engine taking version `v`: its evaluation when due, then asking for the next.
  void after_update(int64_t v);
  // Asks for the next version (if not yet asked), waits until the engine took it, follows it up.
  void wait_weights();
  // Takes the warmed-up base into the engine's weights, in place (its CUDA graphs stay valid), and
  // forgets the prefix cache the old weights filled.
  void receive_warmed_base();
  // Asks the train ranks for version followed_ + 1 (once).
  void request_next();
  // The colocated hand-over (RlOptions::kv_handover): frees the engine's KV pool, nothing being in
  // flight, and tells its trainer that `phase` may train; the next work takes the pool back.
  // Returns the seconds the release took.
  double hand_over_kv(const std::string& phase);
  InferReport rollout(int64_t step);
  // Multi-turn (--env): step s's episodes (n per task of this rank's shard), scored by the
  // environment, one sample per trajectory segment; and the held-out success rate (greedy).
  InferReport rollout_episodes(int64_t step);
  double evaluate_episodes();
  // Packs `pending` and queues the micro-batches; waits (following updates) while the queue is
  // full.
  int64_t send(std::vector<SampleGroup>& pending, int64_t step);
  // Step `step`'s way to the train ranks (staleness rule, advantages, send, end of step).
  RolloutBatcher batcher(int64_t step);
  // The prompts (indices into `cost`, each prompt's expected tokens) this infer rank generates:
  // longest first to the least loaded rank, the same split on every rank.
  std::vector<size_t> own_share(const std::vector<int64_t>& cost) const;
  // The sampling seed of prompt `i` of step `step` (the same on whichever rank runs it).
  uint64_t request_seed(int64_t step, size_t i) const;

  RlContext& c_;
  const RlOptions& o_;
  std::shared_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<PromptEncoder> prompts_;
  std::unique_ptr<Rewarder> rewarder_;   // the built-in reward or --reward COMMAND
  std::unique_ptr<TraceWriter> traces_;  // --traces (the engine's tokenizer outlives it)
  std::unique_ptr<sync::WeightLayout> layout_;
  std::shared_ptr<sync::WeightSync> ws_;  // the engine loop's weight source; request() only here
  // A LoRA run's whole-model warm-up (hands_over_warmed_base): its weights, received once.
  std::unique_ptr<sync::WeightLayout> base_layout_;
  std::unique_ptr<sync::WeightSync> base_ws_;
  std::unique_ptr<sync::RolloutSender> sender_;
  // --env: the model's chat template, the environment and the episode runner over the engine.
  std::unique_ptr<text::ChatTemplate> chat_;
  std::unique_ptr<Environment> env_;
  std::unique_ptr<EpisodeRunner> episodes_;
  std::vector<size_t> eval_rows_;
  // The newest version after_update ran for. The engine's version (loop_->weight_version()) is at
  // most one ahead: the next is asked for only at the end of after_update.
  int64_t followed_ = 0;
  int64_t requested_ = 0;  // the newest version asked for
  int64_t evals_ = 0;
  // A reward program's requests and failures in evaluations, for the next step's report.
  int64_t eval_reward_requests_ = 0, eval_reward_errors_ = 0;
  double sync_mark_s_ = 0;    // loop_->weight_update_seconds() at the last step's metrics
  int64_t reuses_mark_ = 0;   // loop_->gauges().lora_slot_reuses at the last step's metrics
  double busy_s_ = 0;         // rollout/eval requests in flight since the last step's metrics
  double switch_mark_s_ = 0;  // loop_->gauges().kv_restore_seconds at the last step's metrics
};

}  // namespace crl::trainer

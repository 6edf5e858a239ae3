// The RL job's typed control plane (docs/design.md §5): what each rank reports per GRPO step, the
// evaluation results, how a step's reports add up over the ranks, and the --metrics file's row.
// Each struct has one JSON form (to_json/from_json below); this header and its .cpp are the one
// place a metric is named. The reports travel through a sync::Coordinator.
//
// A new per-step metric: a field in InferReport or TrainReport (+ its line in to_json/from_json),
// how it adds up in combine(), and, if the --metrics file shows it, a field of RlMetricsRow.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "sync/coordinator.h"
#include "trainer/metrics.h"

namespace crl::trainer {

// An infer rank's GRPO step (RolloutProducer): its shard's rollouts and its engine.
struct InferReport {
  int64_t samples = 0;         // completions scored
  double reward_sum = 0;       // of their rewards
  double reward_sq = 0;        // of their squares
  int64_t correct = 0;         // completions judged correct
  int64_t gen_tokens = 0;      // tokens generated
  int64_t truncated = 0;       // completions cut by --max-tokens (episodes: by the token cap)
  int64_t gen_len_max = 0;     // the longest completion's tokens (episodes: model tokens)
  int64_t gen_len_min = 0;     // the shortest's (0 without samples)
  double gen_s = 0;            // wall time of the step's generation
  int64_t rollout_bytes = 0;   // packed micro-batches sent
  double reward_mean = 0;      // reward_sum / samples
  int64_t groups_dropped = 0;  // groups with a token older than --max-staleness allows
  int64_t groups = 0;          // groups trained on (RolloutBatcher::groups_kept)
  int64_t groups_without_signal = 0;  // of them, every sample scored the same (advantages 0)
  int64_t stale_tokens = 0;           // tokens sampled by weights older than the step trains
  double gate_wait_s = 0;             // waiting for weights no older than the step allows
  double sync_s = 0;                  // the engine taking weight versions since the last report
  double busy_s = 0;                  // rollout and eval requests in flight since the last report
  double switch_s = 0;  // colocated hand-over: freeing the KV pool now + taking it back since
                        // the last report (0 without the hand-over)
  int64_t engine_version = 0;  // the engine's weights at the report
  double elapsed_s = 0;        // since the job started
  int64_t store_ops = 0;       // store requests since the last report (sync/store.h)
  int64_t store_bytes = 0;     // their key + value bytes
  // Multi-turn (--env) only, else 0: episodes played, their assistant turns, tool calls that did
  // not parse, episodes ended by an environment error, and the trajectories' ids after the first
  // model id by loss weight (env_tokens: weight 0, model_tokens: weight 1).
  int64_t episodes = 0;
  int64_t turns = 0;
  int64_t tool_errors = 0;
  int64_t env_errors = 0;
  int64_t env_tokens = 0;
  int64_t model_tokens = 0;
  // LoRA RL: updates since the last report that loaded into a slot a running request still used.
  int64_t lora_slot_reuses = 0;
  // A reward program (--reward COMMAND): its requests and failed requests (rollouts, and the
  // evaluations since the last report), and its extra metrics (per key: the sum over the
  // completions that gave it, and their count).
  int64_t reward_requests = 0;
  int64_t reward_errors = 0;
  std::map<std::string, std::pair<double, int64_t>> reward_extra;
};
void to_json(nlohmann::json& j, const InferReport& r);
void from_json(const nlohmann::json& j, InferReport& r);

// A train rank's GRPO step (RolloutConsumer): its micro-batches, the optimizer step, the sync.
struct TrainReport {
  int64_t step = 0;  // optimizer steps taken
  double loss = 0;   // LossMetrics of its micro-batches (combine_loss_metrics)
  double kl = 0;
  double clip_fraction = 0;
  double gap_max = 0;  // engine vs trainer log-prob gap
  double gap_mean = 0;
  double mismatch_kl = 0;  // LossMetrics's (token-weighted over the rank's micro-batches)
  double mismatch_k3_kl = 0;
  double entropy = 0;  // LossMetrics's (token-weighted)
  double is_weight_mean = 0;
  double is_weight_max = 0;
  int64_t staleness_sum = 0;  // versions behind the trained weights, over loss tokens
  int64_t staleness_max = 0;
  int64_t loss_tokens = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t optimizer_updates = 0;            // AdamW steps this GRPO step (--ppo-mini-batches x
                                            // --ppo-epochs, less those no rank had tokens for)
  int64_t micro_batches = 0;                // trained (0: the loss figures mean nothing)
  int64_t zero_rounds = 0;                  // stage 2: collective rounds (empty ones included)
  int64_t zero_rounds_while_receiving = 0;  // ... run before this rank's stream ended
  int64_t train_tokens = 0;                 // tokens forwarded
  int64_t rollout_bytes = 0;                // micro-batch bytes received
  double wait_s = 0;                        // waiting for rollouts (and the rollouts barrier)
  double train_s = 0;                       // forward, backward and optimizer
  double elapsed_s = 0;                     // since the job started
  int64_t peak_rss = 0;                     // bytes
  double sync_send_s = 0;                   // sending the new weights (ZeRO-3: gathering them too)
  int64_t update_gathered = 0;  // ZeRO-3: the most gathered parameter bytes the send held
  double send_wait_s = 0;       // waiting for the engines to ask for them
  double switch_s = 0;      // colocated hand-over: returning cached device memory (0 without it)
  std::string checkpoint;   // the checkpoint written this step ("": none)
  double checkpoint_s = 0;  // its write time
  int64_t store_ops = 0;    // as InferReport's
  int64_t store_bytes = 0;
};
void to_json(nlohmann::json& j, const TrainReport& r);
void from_json(const nlohmann::json& j, TrainReport& r);

// What one rank reports for one GRPO step (its JSON form carries the role).
using RankReport = std::variant<InferReport, TrainReport>;

// One GRPO step over every rank: sums, token-weighted sums and maxima (of the ranks that trained
// micro-batches, for the loss figures).
struct StepTotals {
  double samples = 0, rsum = 0, rsq = 0, correct = 0, gen_tokens = 0, gen_s = 0, sync_s = 0;
  double truncated = 0, len_max = 0, len_min = -1;  // len_min -1: no samples yet
  double loss = 0, kl = 0, clip = 0, gap_max = 0, gap_mean_w = 0, loss_tokens = 0, tokens = 0;
  double mismatch_kl_w = 0, mismatch_k3_kl_w = 0, entropy_w = 0;
  double isw_mean_w = 0, isw_max = 0, stale_sum = 0, stale_max = 0, dropped = 0;
  double train_s = 0, wait_s = 0, gnorm = 0, lr = 0, elapsed = 0, updates = 0;
  double switch_engine_s = 0, switch_train_s = 0;  // the slowest engine's and trainer's hand-over
  double store_ops = 0, store_bytes = 0;
  double episodes = 0, turns = 0, tool_errors = 0, env_errors = 0, env_tokens = 0, model_tokens = 0;
  double lora_slot_reuses = 0;
  double reward_requests = 0, reward_errors = 0;
  double groups = 0, groups_without_signal = 0;
  std::map<std::string, std::pair<double, int64_t>> reward_extra;  // summed over infer ranks
  double infer_busy = 0, infer_span = 0, train_idle = 0, train_span = 0;
  double zero_rounds = 0,
         zero_rounds_while_receiving = 0;  // ZeRO-2 rounds, summed over train ranks
  int64_t engine_version = 0, peak_rss = 0;
  int64_t update_gathered = 0;  // the largest of the train ranks'
  int trains = 0;
};
// Whether GRPO's first steps gave it little to learn from: at least half of the groups scored the
// same on every sample (`no_signal_share`, the mean of RlMetricsRow::frac_reward_zero_std) at a
// mean sampled reward below 0.1. On two --data tasks after short warm-ups every run at >= 0.1 over
// its first 10 steps raised held-out accuracy, 27 of 27; of the 7 below, 4 lowered it
// (docs/rl-job.md, "A task of one's own").
bool little_grpo_signal(double no_signal_share, double reward_mean);

// How the ranks' reports of one step add up. spans[r]: rank r's wall seconds since its previous
// report (its part of the job's time, for the idle shares). REQUIRES: spans.size() ==
// reports.size().
StepTotals combine(const std::vector<RankReport>& reports, const std::vector<double>& spans);
double elapsed_of(const RankReport& report);

// A held-out evaluation: at the start, after the SFT warm-up, or after a GRPO step.
struct EvalReport {
  double accuracy = 0;   // over every held-out row (all infer ranks, already reduced)
  double elapsed_s = 0;  // since the job started
};
void to_json(nlohmann::json& j, const EvalReport& r);
void from_json(const nlohmann::json& j, EvalReport& r);

struct EvalPoint {
  enum class Kind { kStart, kSft, kStep };
  Kind kind = Kind::kStart;
  int64_t step = -1;  // kStep: after GRPO step `step` (0-based)

  static EvalPoint start() { return {Kind::kStart, -1}; }
  static EvalPoint sft() { return {Kind::kSft, -1}; }
  static EvalPoint after_step(int64_t s) { return {Kind::kStep, s}; }
};

// A GRPO step's metrics: StepMetrics's fields and the RL job's own.
struct RlMetricsRow {
  StepMetrics m;
  double step_s = 0;      // the step's wall time (the slowest rank's, since its previous report)
  double throughput = 0;  // tokens forwarded by the trainers per second of step and per rank
  double time_generate_s = 0;       // slowest infer rank's generation
  double time_wait_rollouts_s = 0;  // slowest train rank's wait for rollouts
  double time_train_s = 0;          // slowest train rank's compute
  double time_sync_s = 0;           // slowest engine's weight update
  double time_switch_engine_s = 0;  // colocated hand-over: slowest engine's (free + take back)
  double time_switch_train_s = 0;   // ... slowest trainer's (cached device memory returned)
  double generated_tokens = 0;
  double train_tokens = 0;
  double staleness_mean = 0;  // per loss token
  double staleness_max = 0;
  double groups_dropped = 0;
  double is_weight_mean = 0;  // per loss token
  double is_weight_max = 0;
  double engine_idle_share = 0;   // of the infer ranks' time, no request in flight
  double trainer_idle_share = 0;  // of the train ranks' time, waiting
  int64_t engine_version = 0;     // newest engine weights at the reports
  double store_ops = 0;           // store requests of every rank this step
  double store_bytes = 0;
  // ZeRO stage 2: the share of collective rounds a train rank ran while its own rollout stream
  // was still open (over all train ranks).
  double zero_rounds_while_receiving_share = 0;
  // PPO mini-batches: the optimizer updates of the step (the most of any train rank's; they agree).
  double optimizer_updates = 0;
  // Multi-turn (--env): assistant turns per episode, unparsable tool calls, episodes ended by an
  // environment error, and the share of trajectory ids (after the first model id) with loss
  // weight 0 (tool and environment text).
  double turns_per_episode = 0;
  double tool_errors = 0;
  double env_errors = 0;
  double masked_token_share = 0;
  // LoRA RL: policy updates loaded into a slot a running request still used (every infer rank).
  double lora_slot_reuses = 0;
  // A reward program's failed requests, and its extra metrics: per key, the mean over the
  // completions that gave it (written as reward_extra/<key>/mean).
  double reward_errors = 0;
  std::map<std::string, double> reward_extra;
  // The share of the step's groups whose samples all scored the same (no GRPO signal; TRL's
  // frac_reward_zero_std).
  double frac_reward_zero_std = 0;
};
// The --metrics file (JSONL) in the form of verl's file logger, {"step": N, "data": {...}},
// with verl's metric names wherever the quantity is the same (critic/score/mean, actor/pg_loss,
// response_length/mean, rollout_corr/kl, timing_s/gen, perf/throughput, ...) and crl/<name> for
// the project's own; counts are integers. The name table: metric_names(), docs/rl-job.md. Rows:
//   {"step": 0, "config": {...}, "data": {}}             first: the run's settings
//   {"step": 0, "eval": "start" | "after_sft", "data": {"val-core/held_out/acc/mean@1": A}}
//   {"step": S, "phase": "sft", "data": {"sft/loss": L, "sft/grad_norm": G, "sft/lr": R}}
//   {"step": N, "data": {...}}                            a GRPO step (+ its held-out eval,
//                                                         + a reward program's extra metrics)
nlohmann::json metrics_file_row(const RlMetricsRow& r);
// The inverse of metrics_file_row (a GRPO row back; m.phase "grpo"). Throws naming a missing name.
RlMetricsRow parse_metrics_file_row(const nlohmann::json& j);
// Every name of a GRPO row's "data" but the held-out eval's, in the order written.
std::vector<std::string> metric_names();
// The held-out accuracy's name (a GRPO row's, when the step evaluated; the eval rows').
inline constexpr const char* kHeldOutAccuracyName = "val-core/held_out/acc/mean@1";

// One step of the SFT warm-up, as the first train rank saw it (the loss a token mean over every
// train rank). The first train rank publishes them all at the end of the warm-up; the report
// writes them to the --metrics file.
struct SftStepReport {
  int64_t step = 0;  // 1-based
  double loss = 0, grad_norm = 0, lr = 0;
};
void publish_sft_steps(sync::Coordinator& coord, const std::vector<SftStepReport>& steps);
std::vector<SftStepReport> wait_sft_steps(sync::Coordinator& coord,
                                          sync::Clock::time_point deadline);
nlohmann::json sft_metrics_file_row(const SftStepReport& s);
// The step's row from its totals; m's step-independent fields (step, phase, weight_version,
// eval_accuracy, elapsed_s) are the caller's.
RlMetricsRow make_metrics_row(const StepTotals& t);

// Through the coordinator (rank 0 publishes evaluations; every rank its step reports).
void publish_report(sync::Coordinator& coord, int64_t step, int rank, const RankReport& report);
std::vector<RankReport> collect_reports(sync::Coordinator& coord, int64_t step, int ranks,
                                        std::chrono::milliseconds timeout);
void publish_eval(sync::Coordinator& coord, const EvalPoint& at, const EvalReport& report);
// Throws naming the evaluation ("start eval", "SFT eval", "step N eval") at `deadline`.
EvalReport wait_eval(sync::Coordinator& coord, const EvalPoint& at,
                     sync::Clock::time_point deadline);

}  // namespace crl::trainer

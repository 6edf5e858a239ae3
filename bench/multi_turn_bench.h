// `colocated-rl bench multi-turn`: multi-turn rollout throughput (issue 28) against the
// turn-synchronous baseline, in one run on one engine.
//
// Plays --episodes episodes of --env (the built-in calculator by default) with an injected tool
// latency (--latency MIN-MAX ms per environment step, seeded), twice with the same seeds:
//   async             an episode's next turn starts as soon as its own tool answered, so the
//                     engine decodes the others while one waits (EpisodeRunner's mode in the job);
//   turn-synchronous  every episode's turn k + 1 waits for turn k of all of them and the slowest
//                     tool call (MultiTurnOptions::turn_synchronous).
// With --concurrency C (environment instances: episodes in flight at most) the async mode starts
// an episode as soon as one ends and the baseline plays waves of C in lockstep. Both modes wait
// the same latency at the same step of a task (DelayedEnv keys it by task and step).
// `colocated-rl bench rollout --multi-turn ...` is the same command.
// Reports wall time, generated tokens/s and episodes/s of each, their ratio, turns per episode,
// the share of later turns' prompt tokens served by the prefix cache, and the trainer tokens per
// trajectory (one sample per segment) against per-turn packing (one sample per turn: its prompt
// and reply). Use a model that calls tools (--model: e.g. a checkpoint of `--env calculator`);
// the embedded default answers at once, so its episodes have one turn.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace crl::bench {

struct MultiTurnBenchOptions {
  std::string model_dir;  // empty: the embedded default
  std::string env = "calculator";
  int32_t episodes = 64;
  int32_t operands = 2;     // the calculator's operands per task (N turns)
  int32_t concurrency = 0;  // episodes in flight at most (0: all at once)
  int32_t max_turns = 4;
  int32_t max_tokens = 64;  // per turn
  int32_t max_episode_tokens = 384;
  std::string latency = "50-500";        // ms per environment step, MIN-MAX
  std::string latency_dist = "uniform";  // or log-uniform
  double temperature = 1.0;
  uint64_t seed = 1;
  int32_t threads = 2;
  std::string kv_memory = "256MiB";
  bool sync_first = false;  // run the turn-synchronous mode first (after a warm-up either way)
};

void add_multi_turn_bench_flags(CLI::App& cmd, MultiTurnBenchOptions& opts);
int run_multi_turn_bench(const MultiTurnBenchOptions& opts);

}  // namespace crl::bench

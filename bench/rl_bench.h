// `colocated-rl bench rollout --end-to-end`: the whole RL job (launcher, engines, trainers, weight
// sync) for a few GRPO steps per (model, topology, --max-staleness) cell. It runs the real job as
// a child process and reads its JSONL metrics: steps/s after the first step, the ratio to the
// row's first K, generated tokens/s over the wall clock, and the median per-phase breakdown
// (generate, wait, train, sync, idle shares). Prints a table; one JSON row per cell.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace crl::bench {

struct RlBenchOptions {
  bool on = false;  // --end-to-end
  std::string shapes = "default,smollm2-135m";
  std::string topologies = "1-1,2-2";  // TRAIN-INFER rank counts
  int steps = 4;
  int prompts = 8;
  int n = 4;
  int max_tokens = 16;
  std::string staleness = "0";  // --max-staleness values, one cell each
  std::string inflight = "keep";
  std::string results = "rl_bench.jsonl";
};

// Adds --end-to-end and its --e2e-* options to `bench rollout`.
void add_rl_bench_flags(CLI::App& rollout, RlBenchOptions& opts);
int run_rl_bench(const RlBenchOptions& opts);

}  // namespace crl::bench

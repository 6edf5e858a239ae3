#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "bench/rollout_bench.h"

namespace crl::app {

Runner register_bench(CLI::App& app) {
  auto opts = std::make_shared<bench::RolloutBenchOptions>();
  auto* cmd = app.add_subcommand("bench", "benchmarks");
  cmd->require_subcommand(1);
  auto* rollout = cmd->add_subcommand("rollout", "rollout (generation) throughput against baselines");
  bench::add_rollout_flags(*rollout, *opts);
  return [opts, rollout]() {
    if (rollout->parsed()) return bench::run_rollout_bench(*opts);
    return 1;
  };
}

}  // namespace crl::app

#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "bench/rollout_bench.h"
#include "bench/serve_bench.h"

namespace crl::app {

Runner register_bench(CLI::App& app) {
  auto opts = std::make_shared<bench::RolloutBenchOptions>();
  auto* cmd = app.add_subcommand("bench", "benchmarks");
  cmd->require_subcommand(1);
  auto* rollout = cmd->add_subcommand("rollout", "rollout (generation) throughput against baselines");
  bench::add_rollout_flags(*rollout, *opts);
  auto serve_opts = std::make_shared<bench::ServeBenchOptions>();
  auto* serve = cmd->add_subcommand("serve", "HTTP API: requests/s, TTFT and inter-token latency at "
                                             "several client counts (from a separate process)");
  bench::add_serve_bench_flags(*serve, *serve_opts);
  return [opts, rollout, serve_opts, serve]() {
    if (rollout->parsed()) return bench::run_rollout_bench(*opts);
    if (serve->parsed()) return bench::run_serve_bench(*serve_opts);
    return 1;
  };
}

}  // namespace crl::app

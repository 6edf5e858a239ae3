// colocated-rl sync-check: trainer -> engine weight syncs on the embedded default (or --model),
// checked for bit-identity, counted and timed.
#include <CLI/CLI.hpp>
#include <stdexcept>

#include "app/commands.h"
#include "app/launcher.h"
#include "app/sync_flags.h"
#include "bench/sync_job.h"
#include "sync/placement.h"

namespace crl::app {

Runner register_sync_check(CLI::App& app) {
  struct Flags {
    EngineFlags engine;
    DistFlags dist;
    int syncs = 3;
    std::string fault;
  };
  auto f = std::make_shared<Flags>();
  f->engine.kv_memory = "32MiB";
  auto* cmd =
      app.add_subcommand("sync-check",
                         "run trainer -> engine weight syncs and check the engines' weights are "
                         "bit-identical to the trainer's");
  add_engine_flags(*cmd, f->engine);
  add_dist_flags(*cmd, f->dist, /*with_sync=*/true);
  add_colocate_flag(*cmd, f->dist);
  cmd->add_option("--syncs", f->syncs, "number of syncs")->capture_default_str();
  cmd->add_option("--inject-fault", f->fault,
                  "tests only: never-join:R, die-mid-sync:R or layout-mismatch:R")
      ->group("");
  return [f]() {
    bench::SyncJobOptions o;
    o.engine = f->engine.resolve();
    if (o.engine.tensor_parallel_size > 1 && o.engine.device != "cpu") {
      throw std::invalid_argument(
          "--tp with --device " + o.engine.device +
          ": sync-check checks a tensor-parallel engine's sync lanes, which run on the CPU "
          "(on GPUs the RL job stages its updates on the leader)");
    }
    o.infer_per_node = f->dist.infer;
    o.train_per_node = f->dist.train;
    o.bucket_bytes = f->dist.bucket_bytes();
    o.sync = f->dist.sync_options();
    o.timeout = f->dist.timeout();
    o.syncs = f->syncs;
    o.fault = f->fault;
    o.comm_backend = f->dist.backend;
    o.colocate = f->dist.colocate;
    // A bad --colocate fails here, once, before any rank starts.
    sync::colocate_pairs(o.colocate, sync::Topology{1, o.infer_per_node, o.train_per_node}, {});
    LaunchOptions lo{f->dist.infer, f->dist.train, o.timeout};
    return run_distributed(
        lo, [o](const sync::RankEnv& env) { return bench::run_sync_check_rank(env, o); });
  };
}

}  // namespace crl::app

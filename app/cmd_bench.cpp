#include <fmt/format.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/cli_style.h"
#include "app/commands.h"
#include "app/launcher.h"
#include "bench/host_step_bench.h"
#include "bench/linear_bench.h"
#include "bench/multi_turn_bench.h"
#include "bench/rl_bench.h"
#include "bench/rollout_bench.h"
#include "bench/serve_bench.h"
#include "bench/sync_job.h"
#include "bench/tokenizer_bench.h"
#include "bench/train_bench.h"
#include "common/check.h"
#include "common/strings.h"
#include "common/units.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"

extern char** environ;

namespace crl::app {
namespace {

struct SyncBenchFlags {
  std::string shapes = "default,smollm2-135m,qwen2-0.5b,qwen2-1.5b";
  std::string dtypes = "float32,bfloat16";
  std::string topologies = "1-1,1-3,2-2";
  int repeats = 5;
  double bucket_mb = 256;
  double timeout_s = 300;
  std::string results = "sync_bench.jsonl";
  std::string device = "cpu";
  int64_t lora_rank = 0;
  int infer_tp = 1;
  bool matrix_cell = false;  // a cell spawned by the matrix below: append, print nothing
};

void print_sync_bench_table(const SyncBenchFlags& f) {
  fmt::print("{}", bench::format_sync_bench_table(f.results));
  fmt::print("(medians of {} after a warm-up; time = slowest receiver; rows also in {})\n",
             f.repeats, f.results);
  std::fflush(stdout);
}

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// Rough peak of one cell: fp32 masters per train rank, the engine (load + weights) per infer
// rank, and the raw baseline's flat buffers.
int64_t estimate_cell_bytes(const std::string& shape, const std::string& dtype, int t, int i) {
  int64_t params = 0;
  for (const auto& p : engine::model_param_specs(engine::preset_config(shape))) {
    int64_t n = 1;
    for (auto d : p.shape) n *= d;
    params += n;
  }
  int64_t esize = dtype == "float32" ? 4 : 2;
  return t * 4 * params + i * 2 * esize * params + (i + 1) * esize * params;
}

int run_sync_bench(const SyncBenchFlags& f) {
  auto shapes = split_list(f.shapes), dtypes = split_list(f.dtypes),
       topos = split_list(f.topologies);
  if (shapes.empty() || dtypes.empty() || topos.empty()) {
    CRL_INVALID("bench sync: --shapes, --dtypes and --topologies need at least one entry");
  }
  std::vector<std::pair<int, int>> tis;
  for (const auto& t : topos) {
    int tr = 0, in = 0;
    char c = 0;
    if (std::sscanf(t.c_str(), "%d%c%d", &tr, &c, &in) != 3 || c != '-' || tr < 1 || in < 1) {
      CRL_INVALID("bench sync: topology '", t, "' is not TRAIN-INFER, e.g. 1-3");
    }
    tis.emplace_back(tr, in);
  }
  for (const auto& d : dtypes) engine::parse_dtype(d);
  for (const auto& s : shapes) engine::preset_config(s);
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));

  if (shapes.size() == 1 && dtypes.size() == 1 && tis.size() == 1) {
    bench::SyncBenchOptions o;
    o.shape = shapes[0];
    o.engine_dtype = dtypes[0];
    o.train_per_node = tis[0].first;
    o.infer_per_node = tis[0].second;
    o.repeats = f.repeats;
    o.bucket_bytes = static_cast<int64_t>(f.bucket_mb * (1 << 20));
    o.timeout = timeout;
    o.results_file = f.results;
    o.device = f.device;
    o.lora_rank = f.lora_rank;
    o.infer_tp = f.infer_tp;
    engine::ensure_preset_model(o.shape, "bfloat16");  // once, before the ranks start
    if (!f.matrix_cell) std::remove(f.results.c_str());
    LaunchOptions lo{o.infer_per_node, o.train_per_node, timeout};
    int rc = run_distributed(
        lo, [o](const sync::RankEnv& env) { return bench::run_sync_bench_rank(env, o); });
    // Only the launcher of the node whose rank 0 wrote the rows has them to print.
    if (rc == 0 && !f.matrix_cell && std::ifstream(f.results).good()) print_sync_bench_table(f);
    return rc;
  }

  // The matrix: one job per cell, one after the other, each its own launcher.
  std::remove(f.results.c_str());
  int failures = 0;
  for (const auto& shape : shapes) {
    for (const auto& dtype : dtypes) {
      for (auto [t, i] : tis) {
        int64_t need = estimate_cell_bytes(shape, dtype, t, i);
        int64_t have = mem_available_bytes();
        std::string topo = fmt::format("{}->{}", t, i);
        if (have > 0 && need > have * 85 / 100) {
          nlohmann::json skip = {{"shape", shape},
                                 {"dtype", dtype},
                                 {"topology", topo},
                                 {"skipped", fmt::format("needs ~{}, {} available",
                                                         format_bytes(need), format_bytes(have))}};
          std::ofstream(f.results, std::ios::app) << skip.dump() << "\n";
          spdlog::warn("bench sync: skipping {} {} {}: {}", shape, dtype, topo,
                       skip["skipped"].get<std::string>());
          continue;
        }
        spdlog::info("bench sync: {} {} train {} -> infer {}", shape, dtype, t, i);
        std::vector<std::string> args = {"/proc/self/exe",
                                         "bench",
                                         "sync",
                                         "--shapes",
                                         shape,
                                         "--dtypes",
                                         dtype,
                                         "--topologies",
                                         fmt::format("{}-{}", t, i),
                                         "--repeats",
                                         std::to_string(f.repeats),
                                         "--sync-bucket-mb",
                                         std::to_string(f.bucket_mb),
                                         "--timeout",
                                         std::to_string(f.timeout_s),
                                         "--results",
                                         f.results,
                                         "--device",
                                         f.device,
                                         "--infer-tp",
                                         std::to_string(f.infer_tp),
                                         "--lora-rank",
                                         std::to_string(f.lora_rank),
                                         "--matrix-cell"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_t pid = 0;
        if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
          throw std::runtime_error("bench sync: cannot spawn a cell");
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
          ++failures;
          spdlog::error("bench sync: cell {} {} {} failed", shape, dtype, topo);
        }
      }
    }
  }
  print_sync_bench_table(f);
  return failures ? 1 : 0;
}

}  // namespace

Runner register_bench(CLI::App& app) {
  auto opts = std::make_shared<bench::RolloutBenchOptions>();
  auto sf = std::make_shared<SyncBenchFlags>();
  auto* cmd = app.add_subcommand("bench", "benchmarks");
  cmd->require_subcommand(1);
  auto* rollout =
      cmd->add_subcommand("rollout", "rollout (generation) throughput against baselines");
  bench::add_rollout_flags(*rollout, *opts);
  auto e2e = std::make_shared<bench::RlBenchOptions>();
  bench::add_rl_bench_flags(*rollout, *e2e);
  // Never parsed here: main() turns `bench rollout --multi-turn` into `bench multi-turn`.
  rollout->add_flag("--multi-turn",
                    "multi-turn rollouts with tool latency against the turn-synchronous "
                    "baseline: the same as `bench multi-turn` (see its --help for its flags)");
  auto* sync = cmd->add_subcommand(
      "sync", "weight sync: bucket mode vs the per-tensor baseline vs one raw broadcast");
  sync->add_option("--shapes", sf->shapes, "model presets, comma-separated")->capture_default_str();
  sync->add_option("--dtypes", sf->dtypes, "engine dtypes, comma-separated")->capture_default_str();
  sync->add_option("--topologies", sf->topologies, "TRAIN-INFER rank counts, comma-separated")
      ->capture_default_str();
  sync->add_option("--repeats", sf->repeats, "timed syncs per mode (medians)")
      ->capture_default_str();
  sync->add_option("--sync-bucket-mb", sf->bucket_mb, "bucket cap in MiB")->capture_default_str();
  sync->add_option("--timeout", sf->timeout_s, "collective timeout in seconds")
      ->capture_default_str();
  sync->add_option("--results", sf->results, "JSONL file the rows go to")->capture_default_str();
  sync->add_option("--lora-rank", sf->lora_rank,
                   "also sync an all-linear LoRA adapter of this rank alone (LoRA RL's update) in "
                   "the same run, next to the whole model (0 = no LoRA row)")
      ->check(at_least(0));
  sync->add_option("--infer-tp", sf->infer_tp,
                   "each engine a tensor-parallel group of this many ranks (CPU): its update "
                   "staged on the leader vs over a sync lane per rank, side by side")
      ->check(in_range(1, 64))
      ->capture_default_str();
  sync->add_option("--device", sf->device,
                   "cpu (Gloo) or cuda (a GPU per rank: NCCL; ranks sharing a GPU: CUDA IPC, "
                   "measured against the device's own copy)")
      ->capture_default_str();
  sync->add_flag("--matrix-cell", sf->matrix_cell, "internal: one cell of a matrix run")->group("");
  auto serve_opts = std::make_shared<bench::ServeBenchOptions>();
  auto* serve = cmd->add_subcommand("serve",
                                    "HTTP API: requests/s, TTFT and inter-token latency at "
                                    "several client counts (from a separate process)");
  bench::add_serve_bench_flags(*serve, *serve_opts);
  auto tok_opts = std::make_shared<bench::TokenizerBenchOptions>();
  auto* tok = cmd->add_subcommand("tokenizer",
                                  "encode MB/s on 1 and N threads vs Hugging Face "
                                  "tokenizers (Node binding), and whether the ids agree");
  bench::add_tokenizer_bench_flags(*tok, *tok_opts);
  auto train_opts = std::make_shared<bench::TrainBenchOptions>();
  auto* train = cmd->add_subcommand("train",
                                    "the trainer alone: ZeRO stages x train ranks (plus "
                                    "checkpointing and offload cells): memory and tokens/s");
  bench::add_train_bench_flags(*train, *train_opts);
  auto linear_opts = std::make_shared<bench::LinearBenchOptions>();
  auto* linear = cmd->add_subcommand("linear",
                                     "the engine's linear layers on the CPU: at::linear (OpenBLAS) "
                                     "against the project's kernels, GFLOP/s per row count");
  bench::add_linear_bench_flags(*linear, *linear_opts);
  auto mt_opts = std::make_shared<bench::MultiTurnBenchOptions>();
  auto* mt = cmd->add_subcommand("multi-turn",
                                 "multi-turn rollouts with tool latency: episodes "
                                 "that overlap their tool waits vs the turn-synchronous "
                                 "baseline, prefix-cache share, trainer tokens");
  bench::add_multi_turn_bench_flags(*mt, *mt_opts);
  auto hs_opts = std::make_shared<bench::HostStepBenchOptions>();
  auto* hs = cmd->add_subcommand("host-step",
                                 "the engine's host work of a decode step without a model "
                                 "(scheduler, step inputs, postprocess) at 256 sequences");
  bench::add_host_step_bench_flags(*hs, *hs_opts);
  return [opts, rollout, sync, sf, serve_opts, serve, e2e, tok_opts, tok, train_opts, train,
          linear_opts, linear, mt_opts, mt, hs_opts, hs]() {
    // Line-buffered even into a pipe or a file: a bench's progress shows while it runs.
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (hs->parsed()) return bench::run_host_step_bench(*hs_opts);
    if (mt->parsed()) return bench::run_multi_turn_bench(*mt_opts);
    if (linear->parsed()) return bench::run_linear_bench(*linear_opts);
    if (train->parsed()) return bench::run_train_bench(*train_opts);
    if (rollout->parsed())
      return e2e->on ? bench::run_rl_bench(*e2e) : bench::run_rollout_bench(*opts);
    if (serve->parsed()) return bench::run_serve_bench(*serve_opts);
    if (tok->parsed()) return bench::run_tokenizer_bench(*tok_opts);
    if (sync->parsed()) return run_sync_bench(*sf);
    return 1;
  };
}

}  // namespace crl::app

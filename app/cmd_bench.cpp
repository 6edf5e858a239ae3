#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "app/launcher.h"
#include "bench/rollout_bench.h"
#include "bench/serve_bench.h"
#include "bench/sync_job.h"
#include "bench/linear_bench.h"
#include "bench/tokenizer_bench.h"
#include "bench/train_bench.h"
#include "common/check.h"
#include "common/strings.h"
#include "common/units.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "trainer/rl_reports.h"

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
    engine::ensure_preset_model(o.shape, "bfloat16");  // once, before the ranks start
    if (!f.matrix_cell) std::remove(f.results.c_str());
    LaunchOptions lo{o.infer_per_node, o.train_per_node, timeout};
    int rc = run_distributed(lo, [o](const sync::RankEnv& env) {
      return bench::run_sync_bench_rank(env, o);
    });
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
          nlohmann::json skip = {{"shape", shape}, {"dtype", dtype}, {"topology", topo},
                                 {"skipped", fmt::format("needs ~{}, {} available",
                                                         format_bytes(need), format_bytes(have))}};
          std::ofstream(f.results, std::ios::app) << skip.dump() << "\n";
          spdlog::warn("bench sync: skipping {} {} {}: {}", shape, dtype, topo,
                       skip["skipped"].get<std::string>());
          continue;
        }
        spdlog::info("bench sync: {} {} train {} -> infer {}", shape, dtype, t, i);
        std::vector<std::string> args = {
            "/proc/self/exe", "bench", "sync", "--shapes", shape, "--dtypes", dtype,
            "--topologies", fmt::format("{}-{}", t, i), "--repeats", std::to_string(f.repeats),
            "--sync-bucket-mb", std::to_string(f.bucket_mb), "--timeout",
            std::to_string(f.timeout_s), "--results", f.results, "--device", f.device,
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

struct E2eFlags {
  bool on = false;
  std::string shapes = "default,smollm2-135m";
  std::string topologies = "1-1,2-2";
  int steps = 4;
  int prompts = 8;
  int n = 4;
  int max_tokens = 16;
  std::string staleness = "0";  // --max-staleness values, one cell each
  std::string inflight = "keep";
  std::string results = "rl_bench.jsonl";
};

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// End-to-end: the real RL job (launcher, engines, trainers, weight sync) for a few GRPO steps per
// (model, topology) cell; steps/s after the first step and the median per-phase breakdown, read
// from the job's own JSONL metrics.
int run_e2e_bench(const E2eFlags& f) {
  std::remove(f.results.c_str());
  fmt::print("| model | train+infer ranks | K | steps | steps/s | vs K=first | gen tok/s (wall) | "
             "engine idle | trainer idle | generate s | wait s | train s | sync ms | max stale | "
             "dropped |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  int failures = 0;
  for (const auto& shape : split_list(f.shapes)) {
    std::string model = engine::ensure_preset_model(shape);
    for (const auto& topo : split_list(f.topologies)) {
     double base_sps = 0;
     for (const auto& k : split_list(f.staleness)) {
      int t = 0, i = 0;
      char c = 0;
      if (std::sscanf(topo.c_str(), "%d%c%d", &t, &c, &i) != 3 || c != '-' || t < 1 || i < 1) {
        CRL_INVALID("bench rollout --end-to-end: topology '", topo, "' is not TRAIN-INFER");
      }
      std::string metrics = f.results + ".steps.jsonl";
      std::vector<std::string> args = {
          "/proc/self/exe", "train", "--gpus-infer", std::to_string(i), "--gpus-train",
          std::to_string(t), "--model", model, "--steps", std::to_string(f.steps),
          "--sft-steps", "0", "--prompts-per-step", std::to_string(f.prompts), "--n-samples",
          std::to_string(f.n), "--max-tokens", std::to_string(f.max_tokens), "--eval-every", "0",
          "--eval-rows", "8", "--metrics", metrics, "--timeout", "900", "--max-staleness", k,
          "--inflight-update", f.inflight};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      pid_t pid = 0;
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
      int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&fa);
      if (rc != 0) throw std::runtime_error("bench rollout --end-to-end: cannot spawn the job");
      int st = 0;
      waitpid(pid, &st, 0);
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        ++failures;
        fmt::print("| {} | {}+{} | {} | failed | | | | | | | | | | | |\n", shape, t, i, k);
        continue;
      }
      std::ifstream in(metrics);
      std::string line;
      std::vector<trainer::RlMetricsRow> rows;
      while (std::getline(in, line)) {
        if (!line.empty()) rows.push_back(nlohmann::json::parse(line).get<trainer::RlMetricsRow>());
      }
      std::vector<double> gen, wait, train, sync, eidle, tidle;
      double gen_tokens = 0, stale = 0, dropped = 0;
      for (size_t r = 1; r < rows.size(); ++r) {  // the first step warms up
        gen.push_back(rows[r].time_generate_s);
        wait.push_back(rows[r].time_wait_rollouts_s);
        train.push_back(rows[r].time_train_s);
        sync.push_back(rows[r].time_sync_s * 1e3);
        eidle.push_back(rows[r].engine_idle_share);
        tidle.push_back(rows[r].trainer_idle_share);
        gen_tokens += rows[r].generated_tokens;
      }
      for (const auto& row : rows) {
        stale = std::max(stale, row.staleness_max);
        dropped += row.groups_dropped;
      }
      double span = rows.size() > 1 ? rows.back().m.elapsed_s - rows.front().m.elapsed_s : 0;
      double sps = span > 0 ? (rows.size() - 1) / span : 0;
      if (base_sps == 0) base_sps = sps;
      nlohmann::json cell = {{"shape", shape},
                             {"train", t},
                             {"infer", i},
                             {"max_staleness", std::stoi(k)},
                             {"inflight", f.inflight},
                             {"steps", rows.size()},
                             {"steps_per_s", sps},
                             {"speedup_vs_first", base_sps > 0 ? sps / base_sps : 0},
                             {"gen_tok_s_wall", span > 0 ? gen_tokens / span : 0},
                             {"engine_idle_share", median_of(eidle)},
                             {"trainer_idle_share", median_of(tidle)},
                             {"generate_s", median_of(gen)},
                             {"wait_s", median_of(wait)},
                             {"train_s", median_of(train)},
                             {"sync_ms", median_of(sync)},
                             {"staleness_max", stale},
                             {"groups_dropped", dropped}};
      std::ofstream(f.results, std::ios::app) << cell.dump() << "\n";
      fmt::print("| {} | {}+{} | {} | {} | {:.3f} | {:.2f}x | {:.0f} | {:.0f}% | {:.0f}% | {:.2f} | "
                 "{:.2f} | {:.2f} | {:.1f} | {:.0f} | {:.0f} |\n",
                 shape, t, i, k, rows.size(), sps, base_sps > 0 ? sps / base_sps : 0,
                 span > 0 ? gen_tokens / span : 0, median_of(eidle) * 100, median_of(tidle) * 100,
                 median_of(gen), median_of(wait), median_of(train), median_of(sync), stale, dropped);
      std::fflush(stdout);
      std::remove(metrics.c_str());
     }
    }
  }
  fmt::print("(steps/s and tok/s: steps 2..{} over the wall clock; other columns: medians; idle: the "
             "share of a step's wall time an engine has no request in flight / a trainer waits; "
             "{} prompts x {} samples, <= {} new tokens; rows in {})\n",
             f.steps, f.prompts, f.n, f.max_tokens, f.results);
  return failures ? 1 : 0;
}

}  // namespace

Runner register_bench(CLI::App& app) {
  auto opts = std::make_shared<bench::RolloutBenchOptions>();
  auto sf = std::make_shared<SyncBenchFlags>();
  auto* cmd = app.add_subcommand("bench", "benchmarks");
  cmd->require_subcommand(1);
  auto* rollout = cmd->add_subcommand("rollout", "rollout (generation) throughput against baselines");
  bench::add_rollout_flags(*rollout, *opts);
  auto e2e = std::make_shared<E2eFlags>();
  rollout->add_flag("--end-to-end", e2e->on,
                    "the whole RL job instead (engines + trainers + weight sync): steps/s and "
                    "the per-phase breakdown");
  rollout->add_option("--e2e-shapes", e2e->shapes, "end-to-end: model presets")->capture_default_str();
  rollout->add_option("--e2e-topologies", e2e->topologies, "end-to-end: TRAIN-INFER ranks")
      ->capture_default_str();
  rollout->add_option("--e2e-steps", e2e->steps, "end-to-end: GRPO steps per cell")
      ->capture_default_str();
  rollout->add_option("--e2e-prompts", e2e->prompts, "end-to-end: prompts per step")
      ->capture_default_str();
  rollout->add_option("--e2e-n", e2e->n, "end-to-end: samples per prompt")->capture_default_str();
  rollout->add_option("--e2e-max-tokens", e2e->max_tokens, "end-to-end: new tokens per sample")
      ->capture_default_str();
  rollout->add_option("--e2e-results", e2e->results, "end-to-end: JSONL rows")->capture_default_str();
  rollout->add_option("--max-staleness", e2e->staleness,
                      "end-to-end: --max-staleness values, one cell each (e.g. 0,1,2)")
      ->capture_default_str();
  rollout->add_option("--inflight-update", e2e->inflight, "end-to-end: keep, recompute or abort")
      ->capture_default_str();
  auto* sync = cmd->add_subcommand(
      "sync", "weight sync: bucket mode vs the per-tensor baseline vs one raw broadcast");
  sync->add_option("--shapes", sf->shapes, "model presets, comma-separated")->capture_default_str();
  sync->add_option("--dtypes", sf->dtypes, "engine dtypes, comma-separated")->capture_default_str();
  sync->add_option("--topologies", sf->topologies, "TRAIN-INFER rank counts, comma-separated")
      ->capture_default_str();
  sync->add_option("--repeats", sf->repeats, "timed syncs per mode (medians)")->capture_default_str();
  sync->add_option("--sync-bucket-mb", sf->bucket_mb, "bucket cap in MiB")->capture_default_str();
  sync->add_option("--timeout", sf->timeout_s, "collective timeout in seconds")->capture_default_str();
  sync->add_option("--results", sf->results, "JSONL file the rows go to")->capture_default_str();
  sync->add_option("--device", sf->device, "cpu (Gloo) or cuda (one GPU per rank, NCCL)")
      ->capture_default_str();
  sync->add_flag("--matrix-cell", sf->matrix_cell, "internal: one cell of a matrix run")->group("");
  auto serve_opts = std::make_shared<bench::ServeBenchOptions>();
  auto* serve = cmd->add_subcommand("serve", "HTTP API: requests/s, TTFT and inter-token latency at "
                                             "several client counts (from a separate process)");
  bench::add_serve_bench_flags(*serve, *serve_opts);
  auto tok_opts = std::make_shared<bench::TokenizerBenchOptions>();
  auto* tok = cmd->add_subcommand("tokenizer", "encode MB/s on 1 and N threads vs Hugging Face "
                                               "tokenizers (Node binding), and whether the ids agree");
  bench::add_tokenizer_bench_flags(*tok, *tok_opts);
  auto train_opts = std::make_shared<bench::TrainBenchOptions>();
  auto* train = cmd->add_subcommand("train", "the trainer alone: ZeRO stages x train ranks (plus "
                                             "checkpointing and offload cells): memory and tokens/s");
  bench::add_train_bench_flags(*train, *train_opts);
  auto linear_opts = std::make_shared<bench::LinearBenchOptions>();
  auto* linear = cmd->add_subcommand("linear", "the engine's linear layers on the CPU: at::linear (OpenBLAS) "
                                               "against the project's kernels, GFLOP/s per row count");
  bench::add_linear_bench_flags(*linear, *linear_opts);
  return [opts, rollout, sync, sf, serve_opts, serve, e2e, tok_opts, tok, train_opts, train, linear_opts, linear]() {
    if (linear->parsed()) return bench::run_linear_bench(*linear_opts);
    if (train->parsed()) return bench::run_train_bench(*train_opts);
    if (rollout->parsed()) return e2e->on ? run_e2e_bench(*e2e) : bench::run_rollout_bench(*opts);
    if (serve->parsed()) return bench::run_serve_bench(*serve_opts);
    if (tok->parsed()) return bench::run_tokenizer_bench(*tok_opts);
    if (sync->parsed()) return run_sync_bench(*sf);
    return 1;
  };
}

}  // namespace crl::app

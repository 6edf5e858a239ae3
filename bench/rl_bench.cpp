#include "bench/rl_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "bench/stats.h"
#include "common/check.h"
#include "common/strings.h"
#include "engine/model/model_cache.h"
#include "trainer/step_reports.h"

extern char** environ;

namespace crl::bench {

void add_rl_bench_flags(CLI::App& rollout, RlBenchOptions& opts) {
  rollout.add_flag("--end-to-end", opts.on,
                   "the whole RL job instead (engines + trainers + weight sync): steps/s and "
                   "the per-phase breakdown");
  rollout.add_option("--e2e-shapes", opts.shapes, "end-to-end: model presets")
      ->capture_default_str();
  rollout.add_option("--e2e-topologies", opts.topologies, "end-to-end: TRAIN-INFER ranks")
      ->capture_default_str();
  rollout.add_option("--e2e-steps", opts.steps, "end-to-end: GRPO steps per cell")
      ->capture_default_str();
  rollout.add_option("--e2e-prompts", opts.prompts, "end-to-end: prompts per step")
      ->capture_default_str();
  rollout.add_option("--e2e-n", opts.n, "end-to-end: samples per prompt")->capture_default_str();
  rollout.add_option("--e2e-max-tokens", opts.max_tokens, "end-to-end: new tokens per sample")
      ->capture_default_str();
  rollout.add_option("--e2e-results", opts.results, "end-to-end: JSONL rows")
      ->capture_default_str();
  rollout
      .add_option("--max-staleness", opts.staleness,
                  "end-to-end: --max-staleness values, one cell each (e.g. 0,1,2)")
      ->capture_default_str();
  rollout.add_option("--inflight-update", opts.inflight, "end-to-end: keep, recompute or abort")
      ->capture_default_str();
}

int run_rl_bench(const RlBenchOptions& f) {
  std::remove(f.results.c_str());
  fmt::print(
      "| model | train+infer ranks | K | steps | steps/s | vs K=first | gen tok/s (wall) | "
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
        std::vector<std::string> args = {"/proc/self/exe",
                                         "train",
                                         "--gpus-infer",
                                         std::to_string(i),
                                         "--gpus-train",
                                         std::to_string(t),
                                         "--model",
                                         model,
                                         "--steps",
                                         std::to_string(f.steps),
                                         "--sft-steps",
                                         "0",
                                         "--prompts-per-step",
                                         std::to_string(f.prompts),
                                         "--n-samples",
                                         std::to_string(f.n),
                                         "--max-tokens",
                                         std::to_string(f.max_tokens),
                                         "--eval-every",
                                         "0",
                                         "--eval-rows",
                                         "8",
                                         "--metrics",
                                         metrics,
                                         "--timeout",
                                         "900",
                                         "--max-staleness",
                                         k,
                                         "--inflight-update",
                                         f.inflight};
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
          if (line.empty()) continue;
          const auto row = nlohmann::json::parse(line);
          // GRPO steps only (the config, eval and SFT rows carry their kind).
          if (!row.contains("config") && !row.contains("eval") && !row.contains("phase"))
            rows.push_back(trainer::parse_metrics_file_row(row));
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
                               {"engine_idle_share", median(eidle)},
                               {"trainer_idle_share", median(tidle)},
                               {"generate_s", median(gen)},
                               {"wait_s", median(wait)},
                               {"train_s", median(train)},
                               {"sync_ms", median(sync)},
                               {"staleness_max", stale},
                               {"groups_dropped", dropped}};
        std::ofstream(f.results, std::ios::app) << cell.dump() << "\n";
        fmt::print(
            "| {} | {}+{} | {} | {} | {:.3f} | {:.2f}x | {:.0f} | {:.0f}% | {:.0f}% | {:.2f} | "
            "{:.2f} | {:.2f} | {:.1f} | {:.0f} | {:.0f} |\n",
            shape, t, i, k, rows.size(), sps, base_sps > 0 ? sps / base_sps : 0,
            span > 0 ? gen_tokens / span : 0, median(eidle) * 100, median(tidle) * 100, median(gen),
            median(wait), median(train), median(sync), stale, dropped);
        std::fflush(stdout);
        std::remove(metrics.c_str());
      }
    }
  }
  fmt::print(
      "(steps/s and tok/s: steps 2..{} over the wall clock; other columns: medians; idle: the "
      "share of a step's wall time an engine has no request in flight / a trainer waits; "
      "{} prompts x {} samples, <= {} new tokens; rows in {})\n",
      f.steps, f.prompts, f.n, f.max_tokens, f.results);
  return failures ? 1 : 0;
}

}  // namespace crl::bench

#include "trainer/rl_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>

#include "common/units.h"
#include "trainer/metrics.h"
#include "trainer/rl_reports.h"

namespace crl::trainer {

void report_rl_job(const RlContext& j, sync::Coordinator& coord) {
  const auto& o = j.o;
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, j.versions.resumed() ? std::ios::app : std::ios::trunc);
    if (!metrics) throw std::runtime_error("cannot open the metrics file " + o.metrics_path);
  }
  if (!j.versions.resumed()) {
    fmt::print("data: {} {} ({}): {} held out for evaluation{}, {} for training\n",
               j.data.split().eval.size() + j.data.split().train.size(), o.env.empty() ? "rows" : "tasks",
               !o.env.empty()          ? "episodes of --env " + o.env
               : o.data_path.empty() ? std::string("built-in copy task")
                                     : o.data_path,
               j.data.split().eval.size(),
               o.eval_rows < 0 ? " (default: a fifth, at most 128; --eval-rows sets it)" : "",
               j.data.split().train.size());
    std::fflush(stdout);
  }
  const EvalReport start = wait_eval(coord, EvalPoint::start(), j.rollout_deadline());
  std::vector<std::pair<std::string, double>> evals = {{"start", start.accuracy}};
  double grpo_start = start.elapsed_s;
  fmt::print("eval start: held-out accuracy {:.3f} ({} rows)\n", evals[0].second,
             j.data.split().eval.size());
  if (j.versions.runs_sft()) {
    const EvalReport e = wait_eval(coord, EvalPoint::sft(), j.rollout_deadline());
    evals.push_back({fmt::format("sft {} steps", o.sft_steps), e.accuracy});
    grpo_start = e.elapsed_s;
    fmt::print("eval after the SFT warm-up ({} steps of {} rows): held-out accuracy {:.3f} "
               "({:.1f} s)\n",
               o.sft_steps, o.sft_rows_per_step, evals.back().second, e.elapsed_s);
  }
  std::fflush(stdout);
  double sum_gen = 0, sum_wait = 0, sum_train = 0, sum_sync = 0, max_gap0 = -1, dropped = 0;
  double infer_busy = 0, infer_span = 0, train_idle = 0, train_span = 0, stale_max = 0;
  double store_ops = 0, store_bytes = 0, last_elapsed = grpo_start;
  int64_t total_gen_tokens = 0, peak_train_rss = 0, steps_done = 0;
  std::map<int, double> prev_elapsed;  // per rank: when its previous step's metrics were written
  for (int64_t step = j.versions.start_step(); step < o.steps; ++step) {
    const std::vector<RankReport> reports =
        collect_reports(coord, step, j.ranks.env.world_size, o.rollout_timeout);
    std::vector<double> spans;
    for (int r = 0; r < j.ranks.env.world_size; ++r) {
      const double el = elapsed_of(reports[r]);
      spans.push_back(el - (prev_elapsed.count(r) ? prev_elapsed[r] : grpo_start));
      prev_elapsed[r] = el;
    }
    const StepTotals t = combine(reports, spans);
    RlMetricsRow row = make_metrics_row(t);
    StepMetrics& m = row.m;
    m.step = step + 1;
    m.phase = "grpo";
    m.weight_version = j.versions.version_at(step) + 1;
    if (j.versions.evaluates_after(step)) {
      const EvalReport e = wait_eval(coord, EvalPoint::after_step(step), j.rollout_deadline());
      m.eval_accuracy = e.accuracy;
      m.elapsed_s = std::max(m.elapsed_s, e.elapsed_s);
    }
    if (max_gap0 < 0) max_gap0 = t.gap_max;
    if (metrics.is_open()) {
      metrics << nlohmann::json(row).dump() << "\n";
      metrics.flush();
    }
    fmt::print("{} | stale {:.2f}/{:.0f} drop {:.0f} isw {:.3f}/{:.3f} | time gen {:.2f} s wait {:.2f} s "
               "train {:.2f} s sync {:.1f} ms | idle engine {:.0f}% trainer {:.0f}%\n",
               format_progress(m), row.staleness_mean, row.staleness_max, row.groups_dropped,
               row.is_weight_mean, row.is_weight_max, row.time_generate_s, row.time_wait_rollouts_s,
               row.time_train_s, row.time_sync_s * 1e3, row.engine_idle_share * 100,
               row.trainer_idle_share * 100);
    if (t.episodes > 0) {  // multi-turn (--env)
      fmt::print("  episodes {:.0f} | turns/episode {:.2f} | tool errors {:.0f} | env errors {:.0f} | "
                 "masked tokens {:.1f}%\n",
                 t.episodes, row.turns_per_episode, row.tool_errors, row.env_errors,
                 row.masked_token_share * 100);
    }
    std::fflush(stdout);
    if (m.eval_accuracy) evals.push_back({fmt::format("step {}", m.step), *m.eval_accuracy});
    sum_gen += t.gen_s;
    sum_wait += t.wait_s;
    sum_train += t.train_s;
    sum_sync += t.sync_s;
    dropped += t.dropped;
    stale_max = std::max(stale_max, t.stale_max);
    infer_busy += t.infer_busy;
    infer_span += t.infer_span;
    train_idle += t.train_idle;
    train_span += t.train_span;
    store_ops += t.store_ops;
    store_bytes += t.store_bytes;
    peak_train_rss = std::max(peak_train_rss, t.peak_rss);
    last_elapsed = m.elapsed_s;
    total_gen_tokens += static_cast<int64_t>(t.gen_tokens);
    ++steps_done;
  }
  double wall = seconds_since(j.t0);
  fmt::print(
      "\nsummary: {} node(s) x ({} infer + {} train ranks), {} GRPO steps{}, {:.1f} s, "
      "--max-staleness {}, --inflight-update {}{}\n",
      j.ranks.g.topo.nnodes, j.ranks.g.topo.infer_per_node, j.ranks.g.topo.train_per_node,
      steps_done,
      j.versions.resumed() ? fmt::format(" (resumed at step {})", j.versions.start_step()) : "",
      wall, o.max_staleness, engine::inflight_policy_name(o.inflight),
      o.reproducible ? ", --reproducible" : "");
  fmt::print("| eval point | held-out accuracy |\n|---|---|\n");
  for (const auto& [name, acc] : evals) fmt::print("| {} | {:.3f} |\n", name, acc);
  if (steps_done > 0) {
    double k = static_cast<double>(steps_done);
    double grpo_s = last_elapsed - grpo_start;
    fmt::print("| phase (mean per step) | seconds |\n|---|---|\n");
    fmt::print("| generate | {:.2f} |\n| wait for rollouts (train) | {:.2f} |\n| train | {:.2f} |\n"
               "| weight sync | {:.3f} |\n",
               sum_gen / k, sum_wait / k, sum_train / k, sum_sync / k);
    fmt::print("GRPO: {:.3f} steps/s, {:.0f} generated tok/s; engines idle {:.0f}%, trainers idle "
               "{:.0f}%; staleness max {:.0f}, {:.0f} groups dropped\n",
               grpo_s > 0 ? k / grpo_s : 0, grpo_s > 0 ? total_gen_tokens / grpo_s : 0,
               infer_span > 0 ? 100 * (1 - infer_busy / infer_span) : 0,
               train_span > 0 ? 100 * train_idle / train_span : 0, stale_max, dropped);
    fmt::print("control plane: {:.0f} store requests per step ({:.1f} per rank), {} per step\n",
               store_ops / k, store_ops / k / j.ranks.env.world_size,
               format_bytes(store_bytes / k));
    fmt::print("generated {} tokens; log-prob gap at the first step {:.2e}; peak train-rank RSS {}\n",
               total_gen_tokens, max_gap0, format_bytes(static_cast<double>(peak_train_rss)));
  }
  double first = evals.front().second, last = evals.back().second;
  fmt::print("held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points)\n", first, last, (last - first) * 100);
  std::fflush(stdout);
}

}  // namespace crl::trainer

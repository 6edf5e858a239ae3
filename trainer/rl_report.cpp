#include "trainer/rl_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "common/units.h"
#include "trainer/metrics.h"

namespace crl::trainer {
namespace {

using nlohmann::json;

json get_json(const sync::StorePtr& store, const std::string& key, sync::Clock::time_point deadline,
              const std::string& what) {
  return json::parse(sync::store_get(store, key, deadline, what));
}

// One step over every rank: sums, token-weighted means and maxima.
struct StepTotals {
  double samples = 0, rsum = 0, rsq = 0, correct = 0, gen_tokens = 0, gen_s = 0, sync_s = 0;
  double loss = 0, kl = 0, clip = 0, gap_max = 0, gap_mean_w = 0, loss_tokens = 0, tokens = 0;
  double isw_mean_w = 0, isw_max = 0, stale_sum = 0, stale_max = 0, dropped = 0;
  double train_s = 0, wait_s = 0, gnorm = 0, lr = 0, elapsed = 0;
  double store_ops = 0, store_bytes = 0;
  double infer_busy = 0, infer_span = 0, train_idle = 0, train_span = 0;
  double zero_rounds = 0, zero_rounds_while_receiving = 0;  // ZeRO-2 rounds, summed over train ranks
  int64_t engine_version = 0, peak_rss = 0;
  int trains = 0;
};

}  // namespace

void report_rl_job(const RlContext& j, const sync::StorePtr& store) {
  const auto& o = j.o;
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, j.resumed ? std::ios::app : std::ios::trunc);
    if (!metrics) throw std::runtime_error("cannot open the metrics file " + o.metrics_path);
  }
  if (!j.resumed) {
    fmt::print("data: {} rows ({}): {} held out for evaluation{}, {} for training\n",
               j.split.eval.size() + j.split.train.size(),
               o.data_path.empty() ? std::string("built-in copy task") : o.data_path,
               j.split.eval.size(),
               o.eval_rows < 0 ? " (default: a fifth, at most 128; --eval-rows sets it)" : "",
               j.split.train.size());
    std::fflush(stdout);
  }
  auto start = get_json(store, j.key("eval/start"), j.rollout_deadline(), "start eval");
  std::vector<std::pair<std::string, double>> evals = {{"start", start["accuracy"].get<double>()}};
  double grpo_start = start["elapsed_s"].get<double>();
  fmt::print("eval start: held-out accuracy {:.3f} ({} rows)\n", evals[0].second, j.split.eval.size());
  if (j.runs_sft()) {
    auto e = get_json(store, j.key("eval/sft"), j.rollout_deadline(), "SFT eval");
    evals.push_back({fmt::format("sft {} steps", o.sft_steps), e["accuracy"].get<double>()});
    grpo_start = e["elapsed_s"].get<double>();
    fmt::print("eval after the SFT warm-up ({} steps of {} rows): held-out accuracy {:.3f} "
               "({:.1f} s)\n",
               o.sft_steps, o.sft_rows_per_step, evals.back().second, e["elapsed_s"].get<double>());
  }
  std::fflush(stdout);
  double sum_gen = 0, sum_wait = 0, sum_train = 0, sum_sync = 0, max_gap0 = -1, dropped = 0;
  double infer_busy = 0, infer_span = 0, train_idle = 0, train_span = 0, stale_max = 0;
  double store_ops = 0, store_bytes = 0, last_elapsed = grpo_start;
  int64_t total_gen_tokens = 0, peak_train_rss = 0, steps_done = 0;
  std::map<int, double> prev_elapsed;  // per rank: when its previous step's metrics were written
  for (int64_t step = j.start_step; step < o.steps; ++step) {
    StepTotals t;
    for (int r = 0; r < j.env.world_size; ++r) {
      std::string k = j.key(fmt::format("m/s{}/r{}", step, r));
      json x = get_json(store, k, j.rollout_deadline(), fmt::format("step {} metrics of rank {}", step + 1, r));
      sync::store_delete(store, k);
      const double el = x["elapsed_s"].get<double>();
      const double span = el - (prev_elapsed.count(r) ? prev_elapsed[r] : grpo_start);
      prev_elapsed[r] = el;
      t.elapsed = std::max(t.elapsed, el);
      t.store_ops += x["store_ops"].get<double>();
      t.store_bytes += x["store_bytes"].get<double>();
      if (x["role"] == "infer") {
        t.samples += x["samples"].get<double>();
        t.rsum += x["reward_sum"].get<double>();
        t.rsq += x["reward_sq"].get<double>();
        t.correct += x["correct"].get<double>();
        t.gen_tokens += x["gen_tokens"].get<double>();
        t.dropped += x["groups_dropped"].get<double>();
        t.gen_s = std::max(t.gen_s, x["gen_s"].get<double>());
        t.sync_s = std::max(t.sync_s, x["sync_s"].get<double>());
        t.engine_version = std::max(t.engine_version, x["engine_version"].get<int64_t>());
        t.infer_busy += std::min(span, x["busy_s"].get<double>());
        t.infer_span += span;
        continue;
      }
      t.train_idle += std::min(span, x["wait_s"].get<double>() + x["send_wait_s"].get<double>());
      t.train_span += span;
      t.zero_rounds += x["zero_rounds"].get<double>();
      t.zero_rounds_while_receiving += x["zero_rounds_while_receiving"].get<double>();
      if (x["micro_batches"].get<int64_t>() == 0) continue;  // nothing to average
      const double lt = x["loss_tokens"].get<double>();
      ++t.trains;
      t.loss += x["loss"].get<double>();
      t.kl += x["kl"].get<double>();
      t.clip += x["clip_fraction"].get<double>() * lt;
      t.gap_max = std::max(t.gap_max, x["gap_max"].get<double>());
      t.gap_mean_w += x["gap_mean"].get<double>() * lt;
      t.isw_mean_w += x["is_weight_mean"].get<double>() * lt;
      t.isw_max = std::max(t.isw_max, x["is_weight_max"].get<double>());
      t.stale_sum += x["staleness_sum"].get<double>();
      t.stale_max = std::max(t.stale_max, x["staleness_max"].get<double>());
      t.loss_tokens += lt;
      t.tokens += x["train_tokens"].get<double>();
      t.train_s = std::max(t.train_s, x["train_s"].get<double>());
      t.wait_s = std::max(t.wait_s, x["wait_s"].get<double>());
      t.gnorm = x["grad_norm"].get<double>();
      t.lr = x["lr"].get<double>();
      t.peak_rss = std::max(t.peak_rss, x["peak_rss"].get<int64_t>());
    }
    StepMetrics m;
    m.step = step + 1;
    m.phase = "grpo";
    const double n = std::max(1.0, t.samples);
    m.reward_mean = t.rsum / n;
    m.reward_std = std::sqrt(std::max(0.0, t.rsq / n - m.reward_mean * m.reward_mean));
    m.accuracy = t.correct / n;
    m.loss = t.trains ? t.loss / t.trains : 0;
    m.kl = t.trains ? t.kl / t.trains : 0;
    m.clip_fraction = t.loss_tokens > 0 ? t.clip / t.loss_tokens : 0;
    m.grad_norm = t.gnorm;
    m.lr = t.lr;
    m.gen_tok_s = t.gen_s > 0 ? t.gen_tokens / t.gen_s : 0;
    m.train_tok_s = t.train_s > 0 ? t.tokens / t.train_s : 0;
    m.sync_ms = t.sync_s * 1e3;
    m.weight_version = j.version_at(step) + 1;
    m.logprob_gap_max = t.gap_max;
    m.logprob_gap_mean = t.loss_tokens > 0 ? t.gap_mean_w / t.loss_tokens : 0;
    if (j.evaluates_after(step)) {
      auto e = get_json(store, j.key(fmt::format("eval/s{}", step)), j.rollout_deadline(),
                        fmt::format("step {} eval", step + 1));
      m.eval_accuracy = e["accuracy"].get<double>();
      t.elapsed = std::max(t.elapsed, e["elapsed_s"].get<double>());
    }
    m.elapsed_s = t.elapsed;
    const double stale_mean = t.loss_tokens > 0 ? t.stale_sum / t.loss_tokens : 0;
    const double isw_mean = t.loss_tokens > 0 ? t.isw_mean_w / t.loss_tokens : 0;
    const double engine_idle = t.infer_span > 0 ? 1 - t.infer_busy / t.infer_span : 0;
    const double trainer_idle = t.train_span > 0 ? t.train_idle / t.train_span : 0;
    if (max_gap0 < 0) max_gap0 = t.gap_max;
    if (metrics.is_open()) {
      json row = to_json(m);
      row["time_generate_s"] = t.gen_s;
      row["time_wait_rollouts_s"] = t.wait_s;
      row["time_train_s"] = t.train_s;
      row["time_sync_s"] = t.sync_s;
      row["generated_tokens"] = t.gen_tokens;
      row["train_tokens"] = t.tokens;
      row["staleness_mean"] = stale_mean;
      row["staleness_max"] = t.stale_max;
      row["groups_dropped"] = t.dropped;
      row["is_weight_mean"] = isw_mean;
      row["is_weight_max"] = t.isw_max;
      row["engine_idle_share"] = engine_idle;
      row["trainer_idle_share"] = trainer_idle;
      row["engine_version"] = t.engine_version;
      row["store_ops"] = t.store_ops;
      row["store_bytes"] = t.store_bytes;
      // ZeRO stage 2: the share of collective rounds a train rank ran while its own rollout stream
      // was still open (over all train ranks).
      row["zero_rounds_while_receiving_share"] =
          t.zero_rounds > 0 ? t.zero_rounds_while_receiving / t.zero_rounds : 0.0;
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    fmt::print("{} | stale {:.2f}/{:.0f} drop {:.0f} isw {:.3f}/{:.3f} | time gen {:.2f} s wait {:.2f} s "
               "train {:.2f} s sync {:.1f} ms | idle engine {:.0f}% trainer {:.0f}%\n",
               format_progress(m), stale_mean, t.stale_max, t.dropped, isw_mean, t.isw_max, t.gen_s,
               t.wait_s, t.train_s, t.sync_s * 1e3, engine_idle * 100, trainer_idle * 100);
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
    last_elapsed = t.elapsed;
    total_gen_tokens += static_cast<int64_t>(t.gen_tokens);
    ++steps_done;
  }
  double wall = seconds_since(j.t0);
  fmt::print("\nsummary: {} node(s) x ({} infer + {} train ranks), {} GRPO steps{}, {:.1f} s, "
             "--max-staleness {}, --inflight-update {}{}\n",
             j.g.topo.nnodes, j.g.topo.infer_per_node, j.g.topo.train_per_node, steps_done,
             j.resumed ? fmt::format(" (resumed at step {})", j.start_step) : "", wall,
             o.max_staleness, engine::inflight_policy_name(o.inflight),
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
               store_ops / k, store_ops / k / j.env.world_size, format_bytes(store_bytes / k));
    fmt::print("generated {} tokens; log-prob gap at the first step {:.2e}; peak train-rank RSS {}\n",
               total_gen_tokens, max_gap0, format_bytes(static_cast<double>(peak_train_rss)));
  }
  double first = evals.front().second, last = evals.back().second;
  fmt::print("held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points)\n", first, last, (last - first) * 100);
  std::fflush(stdout);
}

}  // namespace crl::trainer

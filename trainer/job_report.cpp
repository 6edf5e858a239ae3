#include "trainer/job_report.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/tfevents.h"
#include "common/units.h"
#include "trainer/metrics.h"
#include "trainer/step_reports.h"

namespace crl::trainer {

using nlohmann::json;

namespace {

// What the summary adds up over the GRPO steps.
struct JobTotals {
  double sum_gen = 0, sum_wait = 0, sum_train = 0, sum_sync = 0, max_gap0 = -1, dropped = 0;
  double sum_switch_engine = 0, sum_switch_train = 0;  // the colocated hand-over
  double infer_busy = 0, infer_span = 0, train_idle = 0, train_span = 0, stale_max = 0;
  double store_ops = 0, store_bytes = 0, last_elapsed = 0;
  int64_t total_gen_tokens = 0, peak_train_rss = 0, steps_done = 0;
  int64_t update_gathered = 0;          // ZeRO-3: the most parameter bytes a weight update gathered
  double episodes = 0, env_errors = 0;  // multi-turn (--env) only
  double reward_requests = 0, reward_errors = 0;  // --reward COMMAND only

  void add(const StepTotals& t, double elapsed_s) {
    episodes += t.episodes;
    env_errors += t.env_errors;
    reward_requests += t.reward_requests;
    reward_errors += t.reward_errors;
    if (max_gap0 < 0) max_gap0 = t.gap_max;
    sum_gen += t.gen_s;
    sum_wait += t.wait_s;
    sum_train += t.train_s;
    sum_sync += t.sync_s;
    sum_switch_engine += t.switch_engine_s;
    sum_switch_train += t.switch_train_s;
    dropped += t.dropped;
    stale_max = std::max(stale_max, t.stale_max);
    infer_busy += t.infer_busy;
    infer_span += t.infer_span;
    train_idle += t.train_idle;
    train_span += t.train_span;
    store_ops += t.store_ops;
    store_bytes += t.store_bytes;
    peak_train_rss = std::max(peak_train_rss, t.peak_rss);
    update_gathered = std::max(update_gathered, t.update_gathered);
    last_elapsed = elapsed_s;
    total_gen_tokens += static_cast<int64_t>(t.gen_tokens);
    ++steps_done;
  }
};

class JobReport {
 public:
  JobReport(const RlContext& j, sync::Coordinator& coord) : j_(j), o_(j.o), coord_(coord) {}

  bool run() {
    open_metrics();
    open_tensorboard();
    if (!j_.versions.resumed()) print_data();
    print_recipe();  // a resumed run's too: its rates may not be the first run's
    wait_first_evals();
    std::map<int, double> prev_elapsed;  // per rank: when its previous step's metrics were written
    for (int64_t step = j_.versions.start_step(); step < o_.steps; ++step)
      report_step(step, prev_elapsed);
    print_summary();
    const JobTotals& s = totals_;
    if (s.episodes > 0 && s.env_errors >= s.episodes) {
      fmt::print(
          "every one of the {:.0f} episodes ended in an environment error (the log names them): "
          "nothing was learned from the environment; exit status 1\n",
          s.episodes);
      std::fflush(stdout);
      return false;
    }
    if (s.reward_requests > 0 && s.reward_errors >= s.reward_requests) {
      fmt::print(
          "every request to the reward program failed ({:.0f} errors; the log names them): every "
          "completion scored 0 and nothing was learned; exit status 1\n",
          s.reward_errors);
      std::fflush(stdout);
      return false;
    }
    return true;
  }

 private:
  void open_metrics() {
    if (o_.metrics_path.empty()) return;
    metrics_.open(o_.metrics_path, j_.versions.resumed() ? std::ios::app : std::ios::trunc);
    if (!metrics_) throw std::runtime_error("cannot open the metrics file " + o_.metrics_path);
    write_row({{"step", j_.versions.start_step()}, {"config", config()}, {"data", json::object()}});
  }

  // The run's settings, resolved (defaults and the --lora-rank recipe's included): the first
  // --metrics row.
  json config() const {
    const auto& t = o_.trainer;
    return {{"model", o_.model_dir},
            {"data", o_.data_path.empty() ? "built-in copy task" : o_.data_path},
            {"env", o_.env},
            {"nodes", j_.ranks.g.topo.nnodes},
            {"infer_per_node", j_.ranks.g.topo.infer_per_node},
            {"train_per_node", j_.ranks.g.topo.train_per_node},
            {"device", o_.device},
            {"seed", o_.seed},
            {"reward",
             o_.reward.program.empty() ? reward_kind_name(o_.reward.kind) : o_.reward.program},
            {"answer_extract", answer_extract_name(o_.reward.extract)},
            {"eval_rows", j_.data.split().eval.size()},
            {"sft_steps", o_.sft_steps},
            {"sft_rows_per_step", o_.sft_rows_per_step},
            {"sft_lr", o_.sft_schedule.lr},
            {"sft_on_answers", o_.sft_on_answers},
            {"steps", o_.steps},
            {"start_step", j_.versions.start_step()},
            {"prompts_per_step", o_.prompts_per_step},
            {"n_samples", o_.samples_per_prompt},
            {"temperature", o_.temperature},
            {"max_tokens", o_.max_tokens},
            {"lr", t.schedule.lr},
            {"warmup_steps", t.schedule.warmup_steps},
            {"min_lr", t.schedule.min_lr},
            {"max_grad_norm", t.max_grad_norm},
            {"clip_low", t.grpo.clip_low},
            {"clip_high", t.grpo.clip_high},
            {"kl_coef", t.grpo.kl_coef},
            {"tis_cap", t.grpo.tis_cap},
            {"ppo_mini_batches", o_.ppo_mini_batches},
            {"ppo_epochs", o_.ppo_epochs},
            {"dtype", t.dtype},
            {"zero_stage", t.zero_stage >= 0 ? t.zero_stage
                           : j_.ranks.g.topo.nnodes * j_.ranks.g.topo.train_per_node > 1 ? 2
                                                                                         : 0},
            {"lora_rank", t.lora.rank},
            {"max_staleness", o_.max_staleness},
            {"inflight_update", engine::inflight_policy_name(o_.inflight)},
            {"reproducible", o_.reproducible},
            {"deterministic", o_.deterministic}};
  }

  void write_row(const json& row) {
    if (!metrics_.is_open()) return;
    metrics_ << row.dump() << "\n";
    metrics_.flush();
  }

  void open_tensorboard() {
    if (o_.tensorboard_dir.empty()) return;
    tb_ = std::make_unique<TfEventsWriter>(o_.tensorboard_dir);
  }

  void print_data() const {
    std::string source = o_.data_path.empty() ? "built-in copy task" : o_.data_path;
    if (!o_.env.empty()) {
      source = o_.data_path.empty() ? "episodes of --env " + o_.env
                                    : o_.data_path + ", episodes of --env " + o_.env;
    }
    fmt::print("data: {} {} ({}): {} for training, {} held out for evaluation{}\n",
               j_.data.split().eval.size() + j_.data.split().train.size() +
                   j_.data.split().dropped_train_rows,
               o_.env.empty() || !o_.data_path.empty() ? "rows" : "tasks", source,
               j_.data.split().train.size(), j_.data.split().eval.size(),
               o_.eval_rows < 0 ? " (default: a fifth, at most 128)" : "");
    if ((o_.env.empty() || !o_.data_path.empty()) && j_.data.split().dropped_train_rows > 0) {
      fmt::print("data: {} other rows not trained on either: their prompt is a held-out row's\n",
                 j_.data.split().dropped_train_rows);
    }
    fmt::print(
        "held-out eval: greedy (temperature 0), each row right or wrong by the reward ({});\n"
        "  the training reward: the same judge on rollouts sampled at temperature {:g}\n",
        o_.env.empty() ? describe_reward(o_.reward) : "the environment's", o_.temperature);
    std::fflush(stdout);
  }

  // A learning rate as people write it: 3e-4, 2.5e-4, 3.125e-5.
  static std::string rate(double lr) {
    if (!(lr > 0) || !std::isfinite(lr)) return fmt::format("{:g}", lr);
    int e = static_cast<int>(std::floor(std::log10(lr)));
    double m = lr / std::pow(10.0, e);
    if (std::stod(fmt::format("{:.6g}", m)) >= 10) m /= 10, ++e;  // 9.9999999e-5 is 1e-4
    return fmt::format("{:.6g}e{}", m, e);
  }

  // What the warm-up trains on and the two peak rates (the defaults depend on them: app/cmd_train).
  void print_recipe() const {
    const auto& train = j_.data.split().train;
    std::string source = "the answers";
    if (!o_.env.empty()) {
      source = o_.env_options.calculator_demo_any_number && o_.env == "calculator"
                   ? "the calculator's demonstrations (the calls, not the answer)"
                   : "the environment's demonstrations";
    } else if (!o_.sft_on_answers && o_.data_path.empty()) {
      source = "the demonstrations (the format, not the task)";
    } else if (!o_.sft_on_answers && std::any_of(train.begin(), train.end(), [](const TaskRow& r) {
                 return !r.demonstration.empty();
               })) {
      source = "each row's demonstration, else its answer";
    }
    const std::string warmup = o_.sft_steps == 0
                                   ? std::string("no SFT warm-up")
                                   : fmt::format("SFT warm-up {} steps at peak lr {} on {}",
                                                 o_.sft_steps, rate(o_.sft_schedule.lr), source);
    const std::string grpo =
        o_.steps == 0
            ? std::string("no GRPO steps")
            : fmt::format("GRPO {} steps at peak lr {}, {} prompts x {} samples", o_.steps,
                          rate(o_.trainer.schedule.lr), o_.prompts_per_step, o_.samples_per_prompt);
    fmt::print("recipe: {}; {}\n", warmup, grpo);
    std::fflush(stdout);
  }

  // The evaluations before GRPO: at the start, and after the SFT warm-up when there is one.
  void wait_first_evals() {
    const EvalReport start = wait_eval(coord_, EvalPoint::start(), j_.rollout_deadline());
    evals_ = {{"start", start.accuracy}};
    if (tb_) tb_->scalar("eval/held_out_accuracy_start", 0, start.accuracy);
    write_row({{"step", j_.versions.start_step()},
               {"eval", "start"},
               {"data", {{kHeldOutAccuracyName, start.accuracy}}}});
    grpo_start_ = start.elapsed_s;
    fmt::print("eval start: held-out accuracy {:.3f} ({} rows, {:.1f} s)\n", evals_[0].second,
               j_.data.split().eval.size(), start.elapsed_s);
    std::fflush(stdout);  // before the warm-up's own lines, not with the next eval
    if (j_.versions.runs_sft()) {
      const EvalReport e = wait_eval(coord_, EvalPoint::sft(), j_.rollout_deadline());
      evals_.push_back({fmt::format("sft {} steps", o_.sft_steps), e.accuracy});
      if (tb_) tb_->scalar("eval/held_out_accuracy_after_sft", 0, e.accuracy);
      if (metrics_.is_open()) {
        for (const SftStepReport& s : wait_sft_steps(coord_, j_.rollout_deadline()))
          write_row(sft_metrics_file_row(s));
      }
      write_row(
          {{"step", 0}, {"eval", "after_sft"}, {"data", {{kHeldOutAccuracyName, e.accuracy}}}});
      grpo_start_ = e.elapsed_s;
      fmt::print(
          "eval after the SFT warm-up ({} steps of {} rows): held-out accuracy {:.3f} "
          "({:.1f} s)\n",
          o_.sft_steps, o_.sft_rows_per_step, evals_.back().second, e.elapsed_s);
    }
    totals_.last_elapsed = grpo_start_;
    std::fflush(stdout);
  }

  // Step `step`'s reports of every rank: its metrics row, progress lines and evaluation.
  void report_step(int64_t step, std::map<int, double>& prev_elapsed) {
    const std::vector<RankReport> reports =
        collect_reports(coord_, step, j_.ranks.env.world_size, o_.rollout_timeout);
    std::vector<double> spans;
    for (int r = 0; r < j_.ranks.env.world_size; ++r) {
      const double el = elapsed_of(reports[r]);
      spans.push_back(el - (prev_elapsed.count(r) ? prev_elapsed[r] : grpo_start_));
      prev_elapsed[r] = el;
    }
    const StepTotals t = combine(reports, spans);
    RlMetricsRow row = make_metrics_row(t);
    row.step_s = *std::max_element(spans.begin(), spans.end());
    row.throughput = row.step_s > 0 ? row.train_tokens / row.step_s / j_.ranks.env.world_size : 0;
    StepMetrics& m = row.m;
    m.step = step + 1;
    m.phase = "grpo";
    m.weight_version = j_.versions.version_at(step) + 1;
    if (j_.versions.evaluates_after(step)) {
      const EvalReport e = wait_eval(coord_, EvalPoint::after_step(step), j_.rollout_deadline());
      m.eval_accuracy = e.accuracy;
      m.elapsed_s = std::max(m.elapsed_s, e.elapsed_s);
    }
    const json file_row = metrics_file_row(row);
    write_row(file_row);
    if (tb_) {  // every number of the row under its own name
      for (const auto& [name, v] : file_row.at("data").items())
        tb_->scalar(name, m.step, v.get<double>());
      tb_->flush();
    }
    if (legend_) {
      fmt::print("{}", step_line_legend());
      legend_ = false;
    }
    if (o_.verbose) {
      fmt::print(
          "{} | stale {:.2f}/{:.0f} drop {:.0f} isw {:.3f}/{:.3f} | time gen {:.2f} s wait {:.2f} "
          "s train {:.2f} s sync {:.1f} ms{} | idle engine {:.0f}% trainer {:.0f}%\n",
          format_progress(m), row.staleness_mean, row.staleness_max, row.groups_dropped,
          row.is_weight_mean, row.is_weight_max, row.time_generate_s, row.time_wait_rollouts_s,
          row.time_train_s, row.time_sync_s * 1e3,
          o_.kv_handover ? fmt::format(" switch {:.1f}/{:.1f} ms", row.time_switch_engine_s * 1e3,
                                       row.time_switch_train_s * 1e3)
                         : "",
          row.engine_idle_share * 100, row.trainer_idle_share * 100);
    } else {
      StepLineContext c;
      c.total_steps = o_.steps;
      const double done = static_cast<double>(m.step - j_.versions.start_step());
      c.seconds_per_step = done > 0 ? (m.elapsed_s - grpo_start_) / done : 0;
      c.kl = o_.trainer.grpo.kl_coef > 0;
      fmt::print("{}\n", format_step_line(m, c));
    }
    if (m.eval_accuracy) {
      fmt::print("eval after step {}/{}: held-out accuracy {:.3f}\n", m.step, o_.steps,
                 *m.eval_accuracy);
    }
    if (t.episodes > 0) {  // multi-turn (--env)
      fmt::print(
          "  episodes {:.0f} | turns/episode {:.2f} | tool errors {:.0f} | env errors {:.0f} | "
          "masked tokens {:.1f}%\n",
          t.episodes, row.turns_per_episode, row.tool_errors, row.env_errors,
          row.masked_token_share * 100);
    }
    if (t.reward_errors > 0) {
      fmt::print(
          "  reward program errors {:.0f} (their completions scored 0; the log names them)\n",
          t.reward_errors);
    }
    std::fflush(stdout);
    if (m.eval_accuracy) evals_.push_back({fmt::format("step {}", m.step), *m.eval_accuracy});
    rewards_.push_back(m.reward_mean);
    zero_std_.push_back(row.frac_reward_zero_std);
    if (rewards_.size() == kSignalWindow) warn_if_little_signal();
    totals_.add(t, m.elapsed_s);
  }

  void print_summary() const {
    const JobTotals& s = totals_;
    fmt::print(
        "\nsummary: {} node(s) x ({} infer + {} train ranks), {} GRPO steps{}, {:.1f} s, "
        "--max-staleness {}, --inflight-update {}{}\n",
        j_.ranks.g.topo.nnodes, j_.ranks.g.topo.infer_per_node, j_.ranks.g.topo.train_per_node,
        s.steps_done,
        j_.versions.resumed() ? fmt::format(" (resumed at step {})", j_.versions.start_step()) : "",
        seconds_since(j_.t0), o_.max_staleness, engine::inflight_policy_name(o_.inflight),
        o_.reproducible ? ", --reproducible" : "");
    fmt::print("| eval point | held-out accuracy |\n|---|---|\n");
    for (const auto& [name, acc] : evals_) fmt::print("| {} | {:.3f} |\n", name, acc);
    if (s.steps_done > 0) {
      double k = static_cast<double>(s.steps_done);
      double grpo_s = s.last_elapsed - grpo_start_;
      fmt::print("| phase (mean per step) | seconds |\n|---|---|\n");
      fmt::print(
          "| generate | {:.2f} |\n| wait for rollouts (train) | {:.2f} |\n| train | {:.2f} |\n"
          "| weight sync | {:.3f} |\n",
          s.sum_gen / k, s.sum_wait / k, s.sum_train / k, s.sum_sync / k);
      if (o_.kv_handover) {
        fmt::print(
            "| memory hand-over: engine (KV pool freed + taken back) | {:.4f} |\n"
            "| memory hand-over: trainer (cached memory returned) | {:.4f} |\n",
            s.sum_switch_engine / k, s.sum_switch_train / k);
      }
      fmt::print(
          "GRPO: {:.3f} steps/s, {:.0f} generated tok/s; engines idle {:.0f}%, trainers idle "
          "{:.0f}%; staleness max {:.0f}, {:.0f} groups dropped\n",
          grpo_s > 0 ? k / grpo_s : 0, grpo_s > 0 ? s.total_gen_tokens / grpo_s : 0,
          s.infer_span > 0 ? 100 * (1 - s.infer_busy / s.infer_span) : 0,
          s.train_span > 0 ? 100 * s.train_idle / s.train_span : 0, s.stale_max, s.dropped);
      fmt::print("control plane: {:.0f} store requests per step ({:.1f} per rank), {} per step\n",
                 s.store_ops / k, s.store_ops / k / j_.ranks.env.world_size,
                 format_bytes(s.store_bytes / k));
      fmt::print(
          "generated {} tokens; log-prob gap at the first step {:.2e}; peak train-rank RSS {}\n",
          s.total_gen_tokens, s.max_gap0, format_bytes(static_cast<double>(s.peak_train_rss)));
      if (s.update_gathered > 0) {
        fmt::print(
            "ZeRO-3 weight updates held at most {} of gathered parameters a trainer "
            "(--sync-chunk-mb {:g})\n",
            format_bytes(static_cast<double>(s.update_gathered)),
            static_cast<double>(o_.sync.stream_chunk_bytes) / (1 << 20));
      }
    }
    print_gains();
    std::fflush(stdout);
  }

  // After this run's first kSignalWindow GRPO steps (a resumed run's first since the resume):
  // whether they gave GRPO little to learn from (little_grpo_signal).
  void warn_if_little_signal() const {
    double reward = 0, none = 0;
    for (size_t i = 0; i < kSignalWindow; ++i) {
      reward += rewards_[i] / kSignalWindow;
      none += zero_std_[i] / kSignalWindow;
    }
    if (!little_grpo_signal(none, reward)) return;
    const int64_t first = j_.versions.start_step() + 1;
    spdlog::warn(
        "GRPO steps {}-{}: {:.0f}% of the groups scored the same on every sample (sampled reward "
        "{:.3f}), so GRPO has little to learn from: it learns only where a group's samples "
        "differ. A longer warm-up (--sft-steps), a reward with partial credit, or more samples a "
        "prompt (--n-samples) give it more (docs/rl-job.md, \"A task of one's own\")",
        first, first + static_cast<int64_t>(kSignalWindow) - 1, none * 100, reward);
  }

  // Who added what: held-out accuracy at the start, after the warm-up and after GRPO, and the
  // sampled reward of the first and last GRPO steps (10-step means: one step's 128 samples are
  // noisy), with the share of groups GRPO could not learn from (every sample scored the same).
  // The last line keeps the form scripts read: "held-out accuracy A -> B (+N points...".
  void print_gains() const {
    const double first = evals_.front().second, last = evals_.back().second;
    const bool sft = j_.versions.runs_sft();
    const double after_sft = sft ? evals_[1].second : first;
    if (rewards_.size() >= 2) {
      const size_t w = std::min<size_t>(10, rewards_.size() / 2);
      auto mean = [&](const std::vector<double>& v, size_t from) {
        double sum = 0;
        for (size_t i = from; i < from + w; ++i) sum += v[i];
        return sum / static_cast<double>(w);
      };
      const size_t last_from = rewards_.size() - w;
      fmt::print(
          "sampled reward (training rollouts, mean of {} steps): first {:.3f} -> last {:.3f}; "
          "groups whose samples all scored the same (no GRPO signal): {:.0f}% -> {:.0f}%\n",
          w, mean(rewards_, 0), mean(rewards_, last_from), mean(zero_std_, 0) * 100,
          mean(zero_std_, last_from) * 100);
    }
    std::string split;
    if (sft && totals_.steps_done > 0) {
      split = fmt::format(": SFT warm-up {:+.1f}, GRPO {:+.1f}", (after_sft - first) * 100,
                          (last - after_sft) * 100);
    } else if (totals_.steps_done > 0) {
      split = fmt::format(": GRPO {:+.1f}", (last - first) * 100);
    }
    fmt::print("held-out accuracy {:.3f} -> {:.3f} ({:+.1f} points{})\n", first, last,
               (last - first) * 100, split);
  }

  const RlContext& j_;
  const RlOptions& o_;
  sync::Coordinator& coord_;
  std::ofstream metrics_;
  std::unique_ptr<TfEventsWriter> tb_;
  std::vector<std::pair<std::string, double>> evals_;
  std::vector<double> rewards_;   // each GRPO step's sampled reward mean
  std::vector<double> zero_std_;  // ... and its share of groups without signal
  static constexpr size_t kSignalWindow = 10;
  double grpo_start_ = 0;
  JobTotals totals_;
  bool legend_ = true;  // the step lines' legend is still to print
};

}  // namespace

bool report_rl_job(const RlContext& j, sync::Coordinator& coord) {
  return JobReport(j, coord).run();
}

}  // namespace crl::trainer

#include "trainer/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace crl::trainer {

std::string format_progress(const StepMetrics& m) {
  return fmt::format(
      "step {} {} | reward {:.3f}±{:.3f} acc {:.3f} len {:.1f} | loss {:.4g} kl {:.3g} clip {:.3f} "
      "gnorm {:.3g} lr {:.1e} | gen {:.0f} tok/s train {:.0f} tok/s sync {:.1f} ms | v{} gap "
      "{:.1e}/{:.1e} | {:.1f} s",
      m.step, m.phase, m.reward_mean, m.reward_std, m.accuracy, m.response_length_mean, m.loss,
      m.kl, m.clip_fraction, m.grad_norm, m.lr, m.gen_tok_s, m.train_tok_s, m.sync_ms,
      m.weight_version, m.logprob_gap_max, m.logprob_gap_mean, m.elapsed_s);
}

std::string format_duration(double seconds) {
  const int64_t s = seconds > 0 ? static_cast<int64_t>(seconds + 0.5) : 0;
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

namespace {

// Up to 4 significant digits without an exponent where it fits: 4.9, 23.5, 812, 1023.
std::string short_number(double x) {
  return x < 100 ? fmt::format("{:.1f}", x) : fmt::format("{:.0f}", x);
}

// 0.84, 12.5, 1234 (never an exponent).
std::string short_gnorm(double x) {
  return x < 100 ? fmt::format("{:.3g}", x) : fmt::format("{:.0f}", x);
}

// 0.23, 4.51, 12.3, 125.
std::string short_seconds(double x) { return x < 10 ? fmt::format("{:.2f}", x) : short_number(x); }

}  // namespace

std::string format_step_line(const StepMetrics& m, const StepLineContext& c) {
  const std::string kl = c.kl ? fmt::format(" kl {:.1e}", m.kl) : "";
  const int64_t left = std::max<int64_t>(0, c.total_steps - m.step);
  return fmt::format(
      "step {}/{} | reward {:.3f} | loss {:.3g}{} gnorm {} | len {} gap {:.1e} | {} s/step ETA {}",
      m.step, c.total_steps, m.reward_mean, m.loss, kl, short_gnorm(m.grad_norm),
      short_number(m.response_length_mean), m.logprob_gap_max, short_seconds(c.seconds_per_step),
      format_duration(c.seconds_per_step * static_cast<double>(left)));
}

std::string step_line_legend() {
  return "step lines: reward = mean reward of the step's sampled completions; len = their mean "
         "tokens;\n"
         "  gap = largest |engine - trainer| log-prob of a sampled token (0 with --deterministic); "
         "--verbose: every field\n";
}

}  // namespace crl::trainer

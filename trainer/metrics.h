// Per-step training metrics: one struct and its console lines (the --metrics file's form is
// step_reports.h's metrics_file_row). Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace crl::trainer {

struct StepMetrics {
  int64_t step = 0;            // optimizer steps taken (1 after the first)
  std::string phase = "grpo";  // "sft" or "grpo"
  double reward_mean = 0;      // over this step's samples
  double reward_std = 0;
  double accuracy = 0;                  // fraction of this step's samples judged correct
  std::optional<double> eval_accuracy;  // held-out accuracy, when evaluated at this step
  double loss = 0;
  double kl = 0;
  double clip_fraction = 0;
  double grad_norm = 0;
  double lr = 0;
  double gen_tok_s = 0;        // generated tokens per second of generation time
  double train_tok_s = 0;      // forwarded tokens per second of train-step time
  double sync_ms = 0;          // trainer -> engine weight copy time
  int64_t weight_version = 0;  // engine weights after this step's sync
  double logprob_gap_max = 0;  // max |engine raw logprob - trainer logprob| this step
  double logprob_gap_mean = 0;
  double mismatch_kl = 0;  // KL(engine || trainer) on the sampled tokens (LossMetrics)
  double mismatch_k3_kl = 0;
  double entropy = 0;  // the trainer's token-mean entropy at the loss tokens (LossMetrics)
  double response_length_mean = 0;  // generated tokens per sampled completion (or episode)
  int64_t response_length_max = 0;  // the longest of them, and the shortest
  int64_t response_length_min = 0;
  double response_clip_ratio = 0;  // share of them cut by --max-tokens (episodes: token cap)
  double elapsed_s = 0;            // since the run started
};

// The full line (--verbose), e.g.
// "step 12 grpo | reward 0.62±0.31 acc 0.58 len 4.9 | loss -0.013 kl 0.0021 clip 0.004 gnorm 0.84
//  lr 3.0e-04 | gen 950 tok/s train 4100 tok/s sync 1.2 ms | v12 gap 2.4e-07/8.1e-09 | 42.0 s"
std::string format_progress(const StepMetrics& m);

// The console's default step line, at most 120 columns for runs of up to 9999 steps (a test
// holds it to that), e.g.
// "step 12/90 | reward 0.625 | loss -0.013 gnorm 0.84 | len 4.9 gap 2.4e-07 | 0.23 s/step ETA 0:18"
// KL shows only when the loss has a KL term. step_line_legend() says what the fields are.
struct StepLineContext {
  int64_t total_steps = 0;
  double seconds_per_step = 0;  // mean over the GRPO steps so far
  bool kl = false;              // --kl-coef > 0
};
std::string format_step_line(const StepMetrics& m, const StepLineContext& c);
std::string step_line_legend();
// "0:18", "12:05", "1:02:03" (negative: "0:00").
std::string format_duration(double seconds);

}  // namespace crl::trainer

// Per-step training metrics: one struct, its JSON form (one JSONL line per step) and the
// human-readable progress line. Pure functions except MetricsWriter, which owns a file.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
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
  double elapsed_s = 0;  // since the run started
};

nlohmann::json to_json(const StepMetrics& m);
// The inverse of to_json (a --metrics line back; a null eval_accuracy is none).
void from_json(const nlohmann::json& j, StepMetrics& m);

// One line, e.g.
// "step 12 grpo | reward 0.62±0.31 acc 0.58 eval 0.55 | loss -0.013 kl 0.0021 clip 0.004 gnorm 0.84
//  lr 3.0e-04 | gen 950 tok/s train 4100 tok/s sync 1.2 ms | v12 gap 2.4e-07/8.1e-09 | 42.0 s"
std::string format_progress(const StepMetrics& m);

// Appends one JSON object per line to a file, flushed per line.
class MetricsWriter {
 public:
  // Truncates `path`. Throws std::runtime_error when it cannot be opened.
  explicit MetricsWriter(const std::string& path);
  void write(const StepMetrics& m);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace crl::trainer

#include "trainer/metrics.h"

#include <fmt/format.h>

#include <stdexcept>

namespace crl::trainer {

nlohmann::json to_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"phase", m.phase},
                      {"reward_mean", m.reward_mean},
                      {"reward_std", m.reward_std},
                      {"accuracy", m.accuracy},
                      {"loss", m.loss},
                      {"kl", m.kl},
                      {"clip_fraction", m.clip_fraction},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"gen_tok_s", m.gen_tok_s},
                      {"train_tok_s", m.train_tok_s},
                      {"sync_ms", m.sync_ms},
                      {"weight_version", m.weight_version},
                      {"logprob_gap_max", m.logprob_gap_max},
                      {"logprob_gap_mean", m.logprob_gap_mean},
                      {"elapsed_s", m.elapsed_s}};
  j["eval_accuracy"] = m.eval_accuracy ? nlohmann::json(*m.eval_accuracy) : nlohmann::json(nullptr);
  return j;
}

void from_json(const nlohmann::json& j, StepMetrics& m) {
  j.at("step").get_to(m.step);
  j.at("phase").get_to(m.phase);
  j.at("reward_mean").get_to(m.reward_mean);
  j.at("reward_std").get_to(m.reward_std);
  j.at("accuracy").get_to(m.accuracy);
  j.at("loss").get_to(m.loss);
  j.at("kl").get_to(m.kl);
  j.at("clip_fraction").get_to(m.clip_fraction);
  j.at("grad_norm").get_to(m.grad_norm);
  j.at("lr").get_to(m.lr);
  j.at("gen_tok_s").get_to(m.gen_tok_s);
  j.at("train_tok_s").get_to(m.train_tok_s);
  j.at("sync_ms").get_to(m.sync_ms);
  j.at("weight_version").get_to(m.weight_version);
  j.at("logprob_gap_max").get_to(m.logprob_gap_max);
  j.at("logprob_gap_mean").get_to(m.logprob_gap_mean);
  j.at("elapsed_s").get_to(m.elapsed_s);
  const auto& eval = j.at("eval_accuracy");
  m.eval_accuracy = eval.is_null() ? std::nullopt : std::optional<double>(eval.get<double>());
}

std::string format_progress(const StepMetrics& m) {
  std::string eval = m.eval_accuracy ? fmt::format(" eval {:.3f}", *m.eval_accuracy) : "";
  return fmt::format(
      "step {} {} | reward {:.3f}±{:.3f} acc {:.3f}{} | loss {:.4g} kl {:.3g} clip {:.3f} "
      "gnorm {:.3g} lr {:.1e} | gen {:.0f} tok/s train {:.0f} tok/s sync {:.1f} ms | v{} gap "
      "{:.1e}/{:.1e} | {:.1f} s",
      m.step, m.phase, m.reward_mean, m.reward_std, m.accuracy, eval, m.loss, m.kl, m.clip_fraction,
      m.grad_norm, m.lr, m.gen_tok_s, m.train_tok_s, m.sync_ms, m.weight_version, m.logprob_gap_max,
      m.logprob_gap_mean, m.elapsed_s);
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot open metrics file " + path);
}

void MetricsWriter::write(const StepMetrics& m) {
  out_ << to_json(m).dump() << "\n";
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write metrics file " + path_);
}

}  // namespace crl::trainer

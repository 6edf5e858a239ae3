#include "trainer/step_reports.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace crl::trainer {

using nlohmann::json;

void to_json(json& j, const InferReport& r) {
  j = {{"role", "infer"},
       {"samples", r.samples},
       {"reward_sum", r.reward_sum},
       {"reward_sq", r.reward_sq},
       {"correct", r.correct},
       {"gen_tokens", r.gen_tokens},
       {"truncated", r.truncated},
       {"gen_len_max", r.gen_len_max},
       {"gen_len_min", r.gen_len_min},
       {"gen_s", r.gen_s},
       {"rollout_bytes", r.rollout_bytes},
       {"reward_mean", r.reward_mean},
       {"groups_dropped", r.groups_dropped},
       {"stale_tokens", r.stale_tokens},
       {"gate_wait_s", r.gate_wait_s},
       {"sync_s", r.sync_s},
       {"busy_s", r.busy_s},
       {"switch_s", r.switch_s},
       {"engine_version", r.engine_version},
       {"elapsed_s", r.elapsed_s},
       {"store_ops", r.store_ops},
       {"store_bytes", r.store_bytes},
       {"episodes", r.episodes},
       {"turns", r.turns},
       {"tool_errors", r.tool_errors},
       {"env_errors", r.env_errors},
       {"env_tokens", r.env_tokens},
       {"model_tokens", r.model_tokens},
       {"lora_slot_reuses", r.lora_slot_reuses},
       {"reward_requests", r.reward_requests},
       {"reward_errors", r.reward_errors},
       {"groups", r.groups},
       {"groups_without_signal", r.groups_without_signal}};
  json extra = json::object();
  for (const auto& [key, sc] : r.reward_extra) extra[key] = {sc.first, sc.second};
  j["reward_extra"] = std::move(extra);
}

void from_json(const json& j, InferReport& r) {
  j.at("episodes").get_to(r.episodes);
  j.at("turns").get_to(r.turns);
  j.at("tool_errors").get_to(r.tool_errors);
  j.at("env_errors").get_to(r.env_errors);
  j.at("env_tokens").get_to(r.env_tokens);
  j.at("model_tokens").get_to(r.model_tokens);
  j.at("lora_slot_reuses").get_to(r.lora_slot_reuses);
  r.reward_requests = j.value("reward_requests", int64_t{0});  // absent from builds before them
  r.reward_errors = j.value("reward_errors", int64_t{0});
  r.groups = j.value("groups", int64_t{0});
  r.groups_without_signal = j.value("groups_without_signal", int64_t{0});
  if (auto it = j.find("reward_extra"); it != j.end() && it->is_object()) {
    for (const auto& [key, sc] : it->items()) {
      r.reward_extra[key] = {sc.at(0).get<double>(), sc.at(1).get<int64_t>()};
    }
  }
  j.at("samples").get_to(r.samples);
  j.at("reward_sum").get_to(r.reward_sum);
  j.at("reward_sq").get_to(r.reward_sq);
  j.at("correct").get_to(r.correct);
  j.at("gen_tokens").get_to(r.gen_tokens);
  j.at("truncated").get_to(r.truncated);
  r.gen_len_max = j.value("gen_len_max", int64_t{0});  // absent from builds before them
  r.gen_len_min = j.value("gen_len_min", int64_t{0});
  j.at("gen_s").get_to(r.gen_s);
  j.at("rollout_bytes").get_to(r.rollout_bytes);
  j.at("reward_mean").get_to(r.reward_mean);
  j.at("groups_dropped").get_to(r.groups_dropped);
  j.at("stale_tokens").get_to(r.stale_tokens);
  j.at("gate_wait_s").get_to(r.gate_wait_s);
  j.at("sync_s").get_to(r.sync_s);
  j.at("busy_s").get_to(r.busy_s);
  j.at("switch_s").get_to(r.switch_s);
  j.at("engine_version").get_to(r.engine_version);
  j.at("elapsed_s").get_to(r.elapsed_s);
  j.at("store_ops").get_to(r.store_ops);
  j.at("store_bytes").get_to(r.store_bytes);
}

void to_json(json& j, const TrainReport& r) {
  j = {{"role", "train"},
       {"step", r.step},
       {"loss", r.loss},
       {"kl", r.kl},
       {"clip_fraction", r.clip_fraction},
       {"gap_max", r.gap_max},
       {"gap_mean", r.gap_mean},
       {"mismatch_kl", r.mismatch_kl},
       {"mismatch_k3_kl", r.mismatch_k3_kl},
       {"entropy", r.entropy},
       {"is_weight_mean", r.is_weight_mean},
       {"is_weight_max", r.is_weight_max},
       {"staleness_sum", r.staleness_sum},
       {"staleness_max", r.staleness_max},
       {"loss_tokens", r.loss_tokens},
       {"grad_norm", r.grad_norm},
       {"lr", r.lr},
       {"optimizer_updates", r.optimizer_updates},
       {"micro_batches", r.micro_batches},
       {"zero_rounds", r.zero_rounds},
       {"zero_rounds_while_receiving", r.zero_rounds_while_receiving},
       {"train_tokens", r.train_tokens},
       {"rollout_bytes", r.rollout_bytes},
       {"wait_s", r.wait_s},
       {"train_s", r.train_s},
       {"elapsed_s", r.elapsed_s},
       {"peak_rss", r.peak_rss},
       {"sync_send_s", r.sync_send_s},
       {"update_gathered", r.update_gathered},
       {"send_wait_s", r.send_wait_s},
       {"switch_s", r.switch_s},
       {"store_ops", r.store_ops},
       {"store_bytes", r.store_bytes}};
  if (!r.checkpoint.empty()) {
    j["checkpoint"] = r.checkpoint;
    j["checkpoint_s"] = r.checkpoint_s;
  }
}

void from_json(const json& j, TrainReport& r) {
  j.at("step").get_to(r.step);
  j.at("loss").get_to(r.loss);
  j.at("kl").get_to(r.kl);
  j.at("clip_fraction").get_to(r.clip_fraction);
  j.at("gap_max").get_to(r.gap_max);
  j.at("gap_mean").get_to(r.gap_mean);
  j.at("mismatch_kl").get_to(r.mismatch_kl);
  j.at("mismatch_k3_kl").get_to(r.mismatch_k3_kl);
  r.entropy = j.value("entropy", 0.0);  // absent from reports of builds before it
  j.at("is_weight_mean").get_to(r.is_weight_mean);
  j.at("is_weight_max").get_to(r.is_weight_max);
  j.at("staleness_sum").get_to(r.staleness_sum);
  j.at("staleness_max").get_to(r.staleness_max);
  j.at("loss_tokens").get_to(r.loss_tokens);
  j.at("grad_norm").get_to(r.grad_norm);
  j.at("lr").get_to(r.lr);
  r.optimizer_updates = j.value("optimizer_updates", int64_t{1});  // builds before it made one
  j.at("micro_batches").get_to(r.micro_batches);
  j.at("zero_rounds").get_to(r.zero_rounds);
  j.at("zero_rounds_while_receiving").get_to(r.zero_rounds_while_receiving);
  j.at("train_tokens").get_to(r.train_tokens);
  j.at("rollout_bytes").get_to(r.rollout_bytes);
  j.at("wait_s").get_to(r.wait_s);
  j.at("train_s").get_to(r.train_s);
  j.at("elapsed_s").get_to(r.elapsed_s);
  j.at("peak_rss").get_to(r.peak_rss);
  j.at("sync_send_s").get_to(r.sync_send_s);
  r.update_gathered = j.value("update_gathered", int64_t{0});
  j.at("send_wait_s").get_to(r.send_wait_s);
  j.at("switch_s").get_to(r.switch_s);
  j.at("store_ops").get_to(r.store_ops);
  j.at("store_bytes").get_to(r.store_bytes);
  r.checkpoint = j.value("checkpoint", std::string());
  r.checkpoint_s = j.value("checkpoint_s", 0.0);
}

namespace {

RankReport parse_rank_report(const std::string& text) {
  json j = json::parse(text);
  const std::string role = j.at("role").get<std::string>();
  if (role == "infer") return j.get<InferReport>();
  if (role == "train") return j.get<TrainReport>();
  throw std::runtime_error("a step report with unknown role '" + role + "'");
}

}  // namespace

double elapsed_of(const RankReport& report) {
  return std::visit([](const auto& r) { return r.elapsed_s; }, report);
}

StepTotals combine(const std::vector<RankReport>& reports, const std::vector<double>& spans) {
  StepTotals t;
  for (size_t i = 0; i < reports.size(); ++i) {
    const double span = spans.at(i);
    if (const auto* x = std::get_if<InferReport>(&reports[i])) {
      t.elapsed = std::max(t.elapsed, x->elapsed_s);
      t.store_ops += static_cast<double>(x->store_ops);
      t.store_bytes += static_cast<double>(x->store_bytes);
      t.samples += static_cast<double>(x->samples);
      t.rsum += x->reward_sum;
      t.rsq += x->reward_sq;
      t.correct += static_cast<double>(x->correct);
      t.gen_tokens += static_cast<double>(x->gen_tokens);
      t.truncated += static_cast<double>(x->truncated);
      if (x->samples > 0) {
        t.len_max = std::max(t.len_max, static_cast<double>(x->gen_len_max));
        t.len_min = t.len_min < 0 ? static_cast<double>(x->gen_len_min)
                                  : std::min(t.len_min, static_cast<double>(x->gen_len_min));
      }
      t.dropped += static_cast<double>(x->groups_dropped);
      t.episodes += static_cast<double>(x->episodes);
      t.turns += static_cast<double>(x->turns);
      t.tool_errors += static_cast<double>(x->tool_errors);
      t.env_errors += static_cast<double>(x->env_errors);
      t.env_tokens += static_cast<double>(x->env_tokens);
      t.model_tokens += static_cast<double>(x->model_tokens);
      t.lora_slot_reuses += static_cast<double>(x->lora_slot_reuses);
      t.reward_requests += static_cast<double>(x->reward_requests);
      t.reward_errors += static_cast<double>(x->reward_errors);
      t.groups += static_cast<double>(x->groups);
      t.groups_without_signal += static_cast<double>(x->groups_without_signal);
      for (const auto& [key, sc] : x->reward_extra) {
        t.reward_extra[key].first += sc.first;
        t.reward_extra[key].second += sc.second;
      }
      t.gen_s = std::max(t.gen_s, x->gen_s);
      t.sync_s = std::max(t.sync_s, x->sync_s);
      t.switch_engine_s = std::max(t.switch_engine_s, x->switch_s);
      t.engine_version = std::max(t.engine_version, x->engine_version);
      t.infer_busy += std::min(span, x->busy_s);
      t.infer_span += span;
      continue;
    }
    const auto& x = std::get<TrainReport>(reports[i]);
    t.elapsed = std::max(t.elapsed, x.elapsed_s);
    t.store_ops += static_cast<double>(x.store_ops);
    t.store_bytes += static_cast<double>(x.store_bytes);
    t.train_idle += std::min(span, x.wait_s + x.send_wait_s);
    t.switch_train_s = std::max(t.switch_train_s, x.switch_s);
    t.train_span += span;
    t.zero_rounds += static_cast<double>(x.zero_rounds);
    t.zero_rounds_while_receiving += static_cast<double>(x.zero_rounds_while_receiving);
    t.update_gathered = std::max(t.update_gathered, x.update_gathered);  // idle ranks gather too
    t.updates = std::max(t.updates, static_cast<double>(x.optimizer_updates));
    if (x.micro_batches == 0) continue;  // nothing to average
    const double lt = static_cast<double>(x.loss_tokens);
    ++t.trains;
    t.loss += x.loss;
    t.kl += x.kl;
    t.clip += x.clip_fraction * lt;
    t.gap_max = std::max(t.gap_max, x.gap_max);
    t.gap_mean_w += x.gap_mean * lt;
    t.mismatch_kl_w += x.mismatch_kl * lt;
    t.mismatch_k3_kl_w += x.mismatch_k3_kl * lt;
    t.entropy_w += x.entropy * lt;
    t.isw_mean_w += x.is_weight_mean * lt;
    t.isw_max = std::max(t.isw_max, x.is_weight_max);
    t.stale_sum += static_cast<double>(x.staleness_sum);
    t.stale_max = std::max(t.stale_max, static_cast<double>(x.staleness_max));
    t.loss_tokens += lt;
    t.tokens += static_cast<double>(x.train_tokens);
    t.train_s = std::max(t.train_s, x.train_s);
    t.wait_s = std::max(t.wait_s, x.wait_s);
    t.gnorm = x.grad_norm;
    t.lr = x.lr;
    t.peak_rss = std::max(t.peak_rss, x.peak_rss);
  }
  return t;
}

void to_json(json& j, const EvalReport& r) {
  j = {{"accuracy", r.accuracy}, {"elapsed_s", r.elapsed_s}};
}

void from_json(const json& j, EvalReport& r) {
  j.at("accuracy").get_to(r.accuracy);
  j.at("elapsed_s").get_to(r.elapsed_s);
}

namespace {

// One number of a GRPO row: its name in the --metrics file and where it lives in RlMetricsRow.
struct MetricField {
  const char* name;
  bool integer;  // a count: written as an integer
  double (*get)(const RlMetricsRow&);
  void (*set)(RlMetricsRow&, double);
};

#define CRL_METRIC(NAME, INTEGER, MEMBER)                                                \
  MetricField {                                                                          \
    NAME, INTEGER, [](const RlMetricsRow& r) { return static_cast<double>(r.MEMBER); },  \
        [](RlMetricsRow& r, double v) { r.MEMBER = static_cast<decltype(r.MEMBER)>(v); } \
  }

// verl's names first (the quantity is the same), then the project's own.
const MetricField kMetricFields[] = {
    CRL_METRIC("training/global_step", true, m.step),
    CRL_METRIC("critic/score/mean", false, m.reward_mean),
    CRL_METRIC("actor/pg_loss", false, m.loss),
    CRL_METRIC("actor/kl_loss", false, m.kl),
    CRL_METRIC("actor/pg_clipfrac", false, m.clip_fraction),
    CRL_METRIC("actor/entropy", false, m.entropy),
    CRL_METRIC("actor/grad_norm", false, m.grad_norm),
    CRL_METRIC("actor/lr", false, m.lr),
    CRL_METRIC("response_length/mean", false, m.response_length_mean),
    CRL_METRIC("response_length/max", true, m.response_length_max),
    CRL_METRIC("response_length/min", true, m.response_length_min),
    CRL_METRIC("response_length/clip_ratio", false, m.response_clip_ratio),
    CRL_METRIC("rollout_corr/kl", false, m.mismatch_kl),
    CRL_METRIC("rollout_corr/k3_kl", false, m.mismatch_k3_kl),
    CRL_METRIC("timing_s/gen", false, time_generate_s),
    CRL_METRIC("timing_s/update_actor", false, time_train_s),
    CRL_METRIC("timing_s/update_weights", false, time_sync_s),
    CRL_METRIC("timing_s/switch_engine", false, time_switch_engine_s),
    CRL_METRIC("timing_s/switch_trainer", false, time_switch_train_s),
    CRL_METRIC("timing_s/step", false, step_s),
    CRL_METRIC("perf/total_num_tokens", true, train_tokens),
    CRL_METRIC("perf/throughput", false, throughput),
    CRL_METRIC("crl/reward_std", false, m.reward_std),
    CRL_METRIC("crl/accuracy", false, m.accuracy),
    CRL_METRIC("crl/logprob_gap_max", false, m.logprob_gap_max),
    CRL_METRIC("crl/logprob_gap_mean", false, m.logprob_gap_mean),
    CRL_METRIC("crl/gen_tok_s", false, m.gen_tok_s),
    CRL_METRIC("crl/train_tok_s", false, m.train_tok_s),
    CRL_METRIC("crl/weight_version", true, m.weight_version),
    CRL_METRIC("crl/elapsed_s", false, m.elapsed_s),
    CRL_METRIC("crl/time_wait_rollouts_s", false, time_wait_rollouts_s),
    CRL_METRIC("crl/generated_tokens", true, generated_tokens),
    CRL_METRIC("crl/staleness_mean", false, staleness_mean),
    CRL_METRIC("crl/staleness_max", true, staleness_max),
    CRL_METRIC("crl/groups_dropped", true, groups_dropped),
    CRL_METRIC("crl/is_weight_mean", false, is_weight_mean),
    CRL_METRIC("crl/is_weight_max", false, is_weight_max),
    CRL_METRIC("crl/engine_idle_share", false, engine_idle_share),
    CRL_METRIC("crl/trainer_idle_share", false, trainer_idle_share),
    CRL_METRIC("crl/engine_version", true, engine_version),
    CRL_METRIC("crl/store_ops", true, store_ops),
    CRL_METRIC("crl/store_bytes", true, store_bytes),
    CRL_METRIC("crl/zero_rounds_while_receiving_share", false, zero_rounds_while_receiving_share),
    CRL_METRIC("crl/optimizer_updates", true, optimizer_updates),
    CRL_METRIC("crl/turns_per_episode", false, turns_per_episode),
    CRL_METRIC("crl/tool_errors", true, tool_errors),
    CRL_METRIC("crl/env_errors", true, env_errors),
    CRL_METRIC("crl/masked_token_share", false, masked_token_share),
    CRL_METRIC("crl/lora_slot_reuses", true, lora_slot_reuses),
    CRL_METRIC("crl/reward_errors", true, reward_errors),
    CRL_METRIC("crl/frac_reward_zero_std", false, frac_reward_zero_std),
};

// A reward program's extra metric `key` (RlMetricsRow::reward_extra) in a row's "data".
const char* const kRewardExtraPrefix = "reward_extra/";
const char* const kRewardExtraSuffix = "/mean";

#undef CRL_METRIC

}  // namespace

json metrics_file_row(const RlMetricsRow& r) {
  json data = json::object();
  for (const MetricField& f : kMetricFields) {
    const double v = f.get(r);
    if (f.integer) {
      data[f.name] = static_cast<int64_t>(std::llround(v));
    } else {
      data[f.name] = v;
    }
  }
  for (const auto& [key, mean] : r.reward_extra) {
    data[kRewardExtraPrefix + key + kRewardExtraSuffix] = mean;
  }
  if (r.m.eval_accuracy) data[kHeldOutAccuracyName] = *r.m.eval_accuracy;
  return {{"step", r.m.step}, {"data", std::move(data)}};
}

RlMetricsRow parse_metrics_file_row(const json& j) {
  RlMetricsRow r;
  const json& data = j.at("data");
  for (const MetricField& f : kMetricFields) {
    auto it = data.find(f.name);
    // Names added after the format was first written: a file from before them reads as 0.
    if (it == data.end() && (std::string(f.name) == "crl/reward_errors" ||
                             std::string(f.name) == "crl/frac_reward_zero_std")) {
      continue;
    }
    if (it == data.end() || !it->is_number()) {
      throw std::invalid_argument(fmt::format("metrics row of step {}: no number '{}'",
                                              j.value("step", int64_t{-1}), f.name));
    }
    f.set(r, it->get<double>());
  }
  if (auto it = data.find(kHeldOutAccuracyName); it != data.end()) {
    r.m.eval_accuracy = it->get<double>();
  }
  const std::string prefix = kRewardExtraPrefix, suffix = kRewardExtraSuffix;
  for (const auto& [name, v] : data.items()) {
    if (name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 && v.is_number()) {
      r.reward_extra[name.substr(prefix.size(), name.size() - prefix.size() - suffix.size())] =
          v.get<double>();
    }
  }
  r.m.phase = "grpo";
  r.m.sync_ms = r.time_sync_s * 1e3;
  return r;
}

std::vector<std::string> metric_names() {
  std::vector<std::string> names;
  for (const MetricField& f : kMetricFields) names.emplace_back(f.name);
  return names;
}

namespace {

const char* const kSftTopic = "sft";

}  // namespace

void publish_sft_steps(sync::Coordinator& coord, const std::vector<SftStepReport>& steps) {
  json rows = json::array();
  for (const SftStepReport& s : steps) rows.push_back({s.step, s.loss, s.grad_norm, s.lr});
  coord.publish_result(kSftTopic, "steps", rows.dump());
}

std::vector<SftStepReport> wait_sft_steps(sync::Coordinator& coord,
                                          sync::Clock::time_point deadline) {
  std::vector<SftStepReport> out;
  for (const json& row : json::parse(
           coord.wait_result(kSftTopic, "steps", deadline, "the SFT warm-up's step reports"))) {
    out.push_back({row.at(0).get<int64_t>(), row.at(1).get<double>(), row.at(2).get<double>(),
                   row.at(3).get<double>()});
  }
  return out;
}

json sft_metrics_file_row(const SftStepReport& s) {
  return {{"step", s.step},
          {"phase", "sft"},
          {"data", {{"sft/loss", s.loss}, {"sft/grad_norm", s.grad_norm}, {"sft/lr", s.lr}}}};
}

bool little_grpo_signal(double no_signal_share, double reward_mean) {
  return no_signal_share >= 0.5 && reward_mean < 0.1;
}

RlMetricsRow make_metrics_row(const StepTotals& t) {
  RlMetricsRow row;
  StepMetrics& m = row.m;
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
  m.logprob_gap_max = t.gap_max;
  m.logprob_gap_mean = t.loss_tokens > 0 ? t.gap_mean_w / t.loss_tokens : 0;
  m.mismatch_kl = t.loss_tokens > 0 ? t.mismatch_kl_w / t.loss_tokens : 0;
  m.mismatch_k3_kl = t.loss_tokens > 0 ? t.mismatch_k3_kl_w / t.loss_tokens : 0;
  m.entropy = t.loss_tokens > 0 ? t.entropy_w / t.loss_tokens : 0;
  m.response_length_mean = t.gen_tokens / n;
  m.response_length_max = static_cast<int64_t>(t.len_max);
  m.response_length_min = static_cast<int64_t>(std::max(0.0, t.len_min));
  m.response_clip_ratio = t.truncated / n;
  m.elapsed_s = t.elapsed;
  row.time_generate_s = t.gen_s;
  row.time_wait_rollouts_s = t.wait_s;
  row.time_train_s = t.train_s;
  row.time_sync_s = t.sync_s;
  row.time_switch_engine_s = t.switch_engine_s;
  row.time_switch_train_s = t.switch_train_s;
  row.generated_tokens = t.gen_tokens;
  row.train_tokens = t.tokens;
  row.staleness_mean = t.loss_tokens > 0 ? t.stale_sum / t.loss_tokens : 0;
  row.staleness_max = t.stale_max;
  row.groups_dropped = t.dropped;
  row.is_weight_mean = t.loss_tokens > 0 ? t.isw_mean_w / t.loss_tokens : 0;
  row.is_weight_max = t.isw_max;
  row.engine_idle_share = t.infer_span > 0 ? 1 - t.infer_busy / t.infer_span : 0;
  row.trainer_idle_share = t.train_span > 0 ? t.train_idle / t.train_span : 0;
  row.engine_version = t.engine_version;
  row.store_ops = t.store_ops;
  row.store_bytes = t.store_bytes;
  row.optimizer_updates = t.updates;
  row.zero_rounds_while_receiving_share =
      t.zero_rounds > 0 ? t.zero_rounds_while_receiving / t.zero_rounds : 0.0;
  row.turns_per_episode = t.episodes > 0 ? t.turns / t.episodes : 0;
  row.lora_slot_reuses = t.lora_slot_reuses;
  row.tool_errors = t.tool_errors;
  row.env_errors = t.env_errors;
  row.reward_errors = t.reward_errors;
  row.frac_reward_zero_std = t.groups > 0 ? t.groups_without_signal / t.groups : 0;
  for (const auto& [key, sc] : t.reward_extra) {
    if (sc.second > 0) row.reward_extra[key] = sc.first / static_cast<double>(sc.second);
  }
  const double traj = t.env_tokens + t.model_tokens;
  row.masked_token_share = traj > 0 ? t.env_tokens / traj : 0;
  return row;
}

void publish_report(sync::Coordinator& coord, int64_t step, int rank, const RankReport& report) {
  json j;
  std::visit([&](const auto& r) { j = r; }, report);
  coord.publish(step, rank, j.dump());
}

std::vector<RankReport> collect_reports(sync::Coordinator& coord, int64_t step, int ranks,
                                        std::chrono::milliseconds timeout) {
  std::vector<RankReport> out;
  for (const auto& text : coord.collect(step, ranks, timeout))
    out.push_back(parse_rank_report(text));
  return out;
}

namespace {

const char* const kEvalTopic = "eval";

std::string eval_name(const EvalPoint& at) {
  switch (at.kind) {
    case EvalPoint::Kind::kStart:
      return "start";
    case EvalPoint::Kind::kSft:
      return "sft";
    case EvalPoint::Kind::kStep:
      return fmt::format("s{}", at.step);
  }
  return "";
}

std::string eval_what(const EvalPoint& at) {
  switch (at.kind) {
    case EvalPoint::Kind::kStart:
      return "start eval";
    case EvalPoint::Kind::kSft:
      return "SFT eval";
    case EvalPoint::Kind::kStep:
      return fmt::format("step {} eval", at.step + 1);
  }
  return "";
}

}  // namespace

void publish_eval(sync::Coordinator& coord, const EvalPoint& at, const EvalReport& report) {
  coord.publish_result(kEvalTopic, eval_name(at), json(report).dump());
}

EvalReport wait_eval(sync::Coordinator& coord, const EvalPoint& at,
                     sync::Clock::time_point deadline) {
  return json::parse(coord.wait_result(kEvalTopic, eval_name(at), deadline, eval_what(at)))
      .get<EvalReport>();
}

}  // namespace crl::trainer

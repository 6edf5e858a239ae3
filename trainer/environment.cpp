#include "trainer/environment.h"

#include <cmath>
#include <functional>
#include <stdexcept>
#include <thread>

namespace crl::trainer {

nlohmann::ordered_json env_task(const TaskRow& row) {
  using ojson = nlohmann::ordered_json;
  auto parsed = [](const std::string& text, const ojson& fallback) {
    return text.empty() ? fallback : ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  };
  return {
      {"prompt", row.prompt},           {"messages", parsed(row.messages_json, nullptr)},
      {"answer", row.answer},           {"ground_truth", parsed(row.ground_truth_json, row.answer)},
      {"data_source", row.data_source}, {"extra_info", parsed(row.extra_info_json, nullptr)}};
}

const char* env_split_name(EnvSplit split) { return split == EnvSplit::kTrain ? "train" : "eval"; }

std::string env_error_kind(const std::string& error) { return error.substr(0, error.find(':')); }

DelayedEnv::DelayedEnv(std::unique_ptr<Environment> inner, const EnvOptions& options)
    : inner_(std::move(inner)),
      seed_(options.seed),
      min_ms_(options.latency_min_ms),
      max_ms_(options.latency_max_ms),
      log_uniform_(options.latency_log_uniform) {
  if (log_uniform_ && min_ms_ <= 0) {
    throw std::invalid_argument("log-uniform injected latency needs min > 0 ms, got " +
                                std::to_string(min_ms_));
  }
  if (min_ms_ < 0 || max_ms_ < min_ms_) {
    throw std::invalid_argument("injected latency: need 0 <= min <= max ms, got " +
                                std::to_string(min_ms_) + "-" + std::to_string(max_ms_));
  }
}

std::string DelayedEnv::name() const {
  return inner_->name() + " (+" + std::to_string(min_ms_) + "-" + std::to_string(max_ms_) +
         " ms a step, " + (log_uniform_ ? "log-uniform" : "uniform") + ")";
}

EnvReply DelayedEnv::reset(const std::string& episode_id, EnvSplit split, int64_t index,
                           const nlohmann::ordered_json& task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_[episode_id] = {split, index, 0};
  }
  return inner_->reset(episode_id, split, index, task);
}

int32_t DelayedEnv::step_latency_ms(EnvSplit split, int64_t index, int64_t step) const {
  uint64_t h =
      (static_cast<uint64_t>(index) * 2 + (split == EnvSplit::kEval ? 1 : 0)) * 1000003ULL +
      static_cast<uint64_t>(step);
  h = (h ^ (seed_ * 0x9e3779b97f4a7c15ULL)) + 0x9e3779b97f4a7c15ULL;  // splitmix64
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  if (log_uniform_) {
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<int32_t>(
        std::lround(min_ms_ * std::pow(static_cast<double>(max_ms_) / min_ms_, u)));
  }
  return min_ms_ + static_cast<int32_t>(h % static_cast<uint64_t>(max_ms_ - min_ms_ + 1));
}

EnvReply DelayedEnv::step(const std::string& episode_id, const nlohmann::ordered_json& assistant) {
  int32_t ms = max_ms_;  // an episode it never saw reset: the longest wait
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = steps_.find(episode_id);
    if (it != steps_.end())
      ms = step_latency_ms(it->second.split, it->second.index, it->second.steps++);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  EnvReply r = inner_->step(episode_id, assistant);
  if (r.done || !r.error.empty()) forget(episode_id);
  return r;
}

void DelayedEnv::close(const std::string& episode_id) {
  forget(episode_id);
  inner_->close(episode_id);
}

void DelayedEnv::forget(const std::string& episode_id) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_.erase(episode_id);
}

nlohmann::ordered_json DelayedEnv::demonstration(EnvSplit split, int64_t index,
                                                 const nlohmann::ordered_json& task) {
  return inner_->demonstration(split, index, task);
}

}  // namespace crl::trainer

#include "trainer/environment.h"

#include <functional>
#include <stdexcept>
#include <thread>

#include "trainer/calculator_env.h"
#include "trainer/process_env.h"

namespace crl::trainer {

const char* env_split_name(EnvSplit split) { return split == EnvSplit::kTrain ? "train" : "eval"; }

std::string env_error_kind(const std::string& error) { return error.substr(0, error.find(':')); }

std::unique_ptr<Environment> make_environment(const std::string& spec, const EnvOptions& options) {
  if (spec.empty()) throw std::invalid_argument("--env: empty environment (calculator, or a command)");
  std::unique_ptr<Environment> env;
  if (spec == "calculator") {
    env = std::make_unique<CalculatorEnv>(options);
  } else {
    env = std::make_unique<ProcessEnv>(spec, options);
  }
  if (options.latency_max_ms > 0) env = std::make_unique<DelayedEnv>(std::move(env), options);
  return env;
}

DelayedEnv::DelayedEnv(std::unique_ptr<Environment> inner, const EnvOptions& options)
    : inner_(std::move(inner)),
      seed_(options.seed),
      min_ms_(options.latency_min_ms),
      max_ms_(options.latency_max_ms) {
  if (min_ms_ < 0 || max_ms_ < min_ms_) {
    throw std::invalid_argument("injected latency: need 0 <= min <= max ms, got " +
                                std::to_string(min_ms_) + "-" + std::to_string(max_ms_));
  }
}

std::string DelayedEnv::name() const {
  return inner_->name() + " (+" + std::to_string(min_ms_) + "-" + std::to_string(max_ms_) + " ms a step)";
}

EnvReply DelayedEnv::reset(const std::string& episode_id, EnvSplit split, int64_t index) {
  return inner_->reset(episode_id, split, index);
}

EnvReply DelayedEnv::step(const std::string& episode_id, const nlohmann::ordered_json& assistant) {
  // Seeded by the episode and the assistant's message, so a run's delays repeat.
  const uint64_t h = std::hash<std::string>{}(episode_id + assistant.dump()) ^ (seed_ * 0x9e3779b97f4a7c15ULL);
  const int32_t span = max_ms_ - min_ms_ + 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(min_ms_ + static_cast<int32_t>(h % span)));
  return inner_->step(episode_id, assistant);
}

void DelayedEnv::close(const std::string& episode_id) { inner_->close(episode_id); }

nlohmann::ordered_json DelayedEnv::demonstration(EnvSplit split, int64_t index) const {
  return inner_->demonstration(split, index);
}

}  // namespace crl::trainer

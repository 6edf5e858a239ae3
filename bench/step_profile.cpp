#include "bench/step_profile.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace crl::bench {

namespace prof = torch::autograd::profiler;

namespace {
// An exception's first line (libtorch appends its stack).
std::string first_line(const std::exception& e) {
  const std::string w = e.what();
  return w.substr(0, w.find('\n'));
}
}  // namespace

namespace impl = torch::profiler::impl;

StepProfiler::StepProfiler(std::string trace_prefix, const std::string& windows,
                           const std::string& steps_jsonl)
    : prefix_(std::move(trace_prefix)) {
  std::stringstream ss(windows);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no ':'");
      const int64_t first = std::stoll(item.substr(0, colon));
      const int64_t count = std::stoll(item.substr(colon + 1));
      if (first < 1 || count < 1) throw std::invalid_argument("not positive");
      windows_.emplace_back(first, count);
    } catch (const std::exception&) {
      throw std::invalid_argument("profile window '" + item + "': expected FIRST:COUNT, both >= 1");
    }
  }
  if (!steps_jsonl.empty()) {
    steps_.open(steps_jsonl);
    if (!steps_) throw std::invalid_argument("cannot write " + steps_jsonl);
  }
}

StepProfiler::~StepProfiler() {
  try {
    disarm();
  } catch (const std::exception& e) {
    std::cerr << "step profiler: " << e.what() << "\n";
  }
}

void StepProfiler::arm() {
  armed_ = true;
  index_ = 0;
  last_ = std::chrono::steady_clock::now();
  for (size_t w = 0; w < windows_.size(); ++w) {
    if (windows_[w].first == 1 && !prefix_.empty()) {
      open_window_ = static_cast<int64_t>(w);
      start_trace();
    }
  }
}

void StepProfiler::disarm() {
  if (open_window_ >= 0) stop_trace();
  armed_ = false;
}

void StepProfiler::after_step(const engine::StepRecord& r) {
  if (!armed_) return;
  ++index_;
  const auto now = std::chrono::steady_clock::now();
  const double wall = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  if (steps_.is_open()) {
    steps_ << nlohmann::json{{"i", index_},
                             {"seqs", r.seqs},
                             {"tokens", r.tokens},
                             {"prefill", r.prefill_tokens},
                             {"wall_s", wall},
                             {"schedule_s", r.schedule_seconds},
                             {"forward_s", r.forward_seconds},
                             {"sample_s", r.sample_seconds},
                             {"finish_s", r.finish_seconds}}
                  .dump()
           << "\n";
  }
  if (prefix_.empty()) return;
  if (open_window_ >= 0) {
    const auto& [first, count] = windows_[static_cast<size_t>(open_window_)];
    if (index_ >= first + count - 1) stop_trace();
  }
  if (open_window_ < 0) {
    for (size_t w = 0; w < windows_.size(); ++w) {
      if (windows_[w].first == index_ + 1) {
        open_window_ = static_cast<int64_t>(w);
        start_trace();
        break;
      }
    }
  }
  last_ = std::chrono::steady_clock::now();  // the profiler's start is not the next step's time
}

void StepProfiler::start_trace() {
  // A libtorch without Kineto refuses: the benchmark goes on without traces.
  try {
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (at::hasCUDA()) activities.insert(impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    std::cerr << "profile: the Kineto profiler did not start (" << first_line(e)
              << "); no traces\n";
    open_window_ = -1;
    prefix_.clear();
  }
}

void StepProfiler::stop_trace() {
  const auto& [first, count] = windows_[static_cast<size_t>(open_window_)];
  open_window_ = -1;
  const std::string path = prefix_ + "." + std::to_string(first) + ".json";
  try {
    auto result = prof::disableProfiler();
    if (result) result->save(path);
    std::cout << "profile: steps " << first << ".." << first + count - 1 << " -> " << path << "\n";
  } catch (const std::exception& e) {
    std::cerr << "profile: steps " << first << ".." << first + count - 1
              << " not saved: " << first_line(e) << "\n";
  }
}

}  // namespace crl::bench

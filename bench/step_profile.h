// Where a benchmark's engine steps spend their time: a JSON line per step (its shape and host time
// per phase, engine::StepRecord, with its wall time) and Chrome traces of chosen steps from
// libtorch's Kineto profiler (host ops and, on a GPU, every kernel with its device time).
//
//   StepProfiler prof("trace", "20:3,400:5", "steps.jsonl");
//   engine.set_step_observer([&](const engine::StepRecord& r) { prof.after_step(r); });
//   prof.arm();   // counts steps from here: trace.20.json holds steps 20-22, trace.400.json
//   400-404
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/llm_engine.h"

namespace crl::bench {

class StepProfiler {
 public:
  // `trace_prefix`: Chrome traces go to PREFIX.A.json ("" = none); `windows`: "A:N[,B:M...]", N
  // steps from the A-th (1-based) after arm(); `steps_jsonl`: the per-step lines ("" = none).
  // Throws std::invalid_argument for a malformed window.
  StepProfiler(std::string trace_prefix, const std::string& windows,
               const std::string& steps_jsonl);
  ~StepProfiler();

  // Starts counting steps (and the first window when it starts at step 1).
  void arm();
  // Stops counting; a window still open is saved.
  void disarm();
  // The engine's step observer.
  void after_step(const engine::StepRecord& r);

 private:
  void start_trace();
  void stop_trace();

  std::string prefix_;
  std::vector<std::pair<int64_t, int64_t>> windows_;  // (first step, count)
  std::ofstream steps_;
  bool armed_ = false;
  int64_t index_ = 0;         // steps since arm()
  int64_t open_window_ = -1;  // index into windows_ of the trace being recorded
  std::chrono::steady_clock::time_point last_;
};

}  // namespace crl::bench

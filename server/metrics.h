// ServerMetrics: Prometheus counters and histograms of the API server, under vLLM's names.
//
// Thread safety: every method locks; the engine thread records, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_loop.h"

namespace crl::server {

// A cumulative Prometheus histogram over fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends "# TYPE", the _bucket lines, _sum and _count to `out`.
  void render(const std::string& name, const std::string& help, std::string& out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Implements the engine loop's RequestObserver: install it with
// EngineLoop::set_request_observer().
class ServerMetrics : public engine::RequestObserver {
 public:
  ServerMetrics();

  void on_first_token(double seconds) override { record_first_token(seconds); }
  void on_inter_token(double seconds) override { record_inter_token(seconds); }
  void on_finished(int64_t prompt_tokens, int64_t generation_tokens, const std::string& reason,
                   double e2e_seconds) override {
    record_finished(prompt_tokens, generation_tokens, reason, e2e_seconds);
  }

  // A request finished: its prompt and generated tokens, why (stop, length, abort, error) and
  // its end-to-end latency.
  void record_finished(int64_t prompt_tokens, int64_t generation_tokens, const std::string& reason,
                       double e2e_seconds);
  void record_first_token(double seconds);
  // One step that produced tokens for a request which already had some.
  void record_inter_token(double seconds);
  // An HTTP response was sent with this status.
  void record_http_status(int status);

  // Prometheus text exposition (version 0.0.4).
  std::string render(const engine::EngineGauges& gauges, const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_by_reason_;
  std::map<int, int64_t> http_status_;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
};

}  // namespace crl::server

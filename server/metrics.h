// ServerMetrics: Prometheus counters and histograms of the API server, under vLLM's names.
//
// Thread safety: every method locks; the engine thread records, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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

// State of the engine, published by the engine thread after each step.
struct EngineGauges {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;  // in the scheduler's queue, plus held while paused
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;    // blocks with a reference (cached-but-free blocks are free)
  int64_t weight_version = 0;
  int64_t num_preemptions = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t steps = 0;
  bool paused = false;
  bool loaded = false;
};

class ServerMetrics {
 public:
  ServerMetrics();

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
  std::string render(const EngineGauges& gauges, const std::string& model_name) const;

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

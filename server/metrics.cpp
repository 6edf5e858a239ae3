#include "server/metrics.h"

#include <fmt/format.h>

namespace crl::server {

namespace {

// vLLM's bucket bounds for these three histograms.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                         0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                         7.5,   10.0,  20.0, 40.0, 80.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3, 0.4,
                                        0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0, 20.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,   5.0,  10.0,
                                        15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0};

std::string labels(const std::string& model, const std::string& extra = "") {
  std::string l = "model_name=\"" + model + "\"";
  if (!extra.empty()) l += "," + extra;
  return "{" + l + "}";
}

void metric(std::string& out, const char* name, const char* type, const char* help,
            const std::string& label_text, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name,
                     label_text, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += value;
  count_++;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_,
                     name, count_);
}

ServerMetrics::ServerMetrics() : ttft_(kTtftBounds), itl_(kItlBounds), e2e_(kE2eBounds) {}

void ServerMetrics::record_finished(int64_t prompt_tokens, int64_t generation_tokens,
                                    const std::string& reason, double e2e_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
  finished_by_reason_[reason]++;
  e2e_.observe(e2e_seconds);
}

void ServerMetrics::record_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void ServerMetrics::record_inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_status_[status]++;
}

std::string ServerMetrics::render(const engine::EngineGauges& g, const std::string& model) const {
  std::string out;
  const std::string l = labels(model);
  metric(out, "vllm:num_requests_running", "gauge", "Requests in the running batch.", l,
         static_cast<double>(g.running_requests));
  metric(out, "vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", l,
         static_cast<double>(g.waiting_requests));
  const double usage =
      g.kv_blocks_total > 0 ? static_cast<double>(g.kv_blocks_used) / g.kv_blocks_total : 0.0;
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (1 = every block in use).", l,
         usage);
  metric(out, "vllm:num_preemptions_total", "counter", "Sequences preempted (recomputed later).", l,
         static_cast<double>(g.num_preemptions));
  metric(out, "vllm:prefix_cache_hits_total", "counter",
         "Prompt tokens served by the prefix cache.", l,
         static_cast<double>(g.prefix_cache_hit_tokens));
  metric(out, "crl:kv_blocks_used", "gauge", "KV blocks with a reference.", l,
         static_cast<double>(g.kv_blocks_used));
  metric(out, "crl:kv_blocks_free", "gauge", "KV blocks free (prefix-cached ones included).", l,
         static_cast<double>(g.kv_blocks_total - g.kv_blocks_used));
  metric(out, "crl:kv_blocks_total", "gauge", "KV blocks in the pool.", l,
         static_cast<double>(g.kv_blocks_total));
  metric(out, "crl:weight_version", "gauge", "Version of the weights the engine serves.", l,
         static_cast<double>(g.weight_version));
  metric(out, "crl:engine_steps_total", "counter", "Engine steps run.", l,
         static_cast<double>(g.steps));
  metric(out, "crl:paused", "gauge", "1 while admission is paused (/pause).", l, g.paused ? 1 : 0);

  std::lock_guard<std::mutex> lock(mu_);
  metric(out, "vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", l,
         static_cast<double>(prompt_tokens_));
  metric(out, "vllm:generation_tokens_total", "counter", "Generated tokens of finished requests.",
         l, static_cast<double>(generation_tokens_));
  out +=
      "# HELP vllm:request_success_total Finished requests by finish reason.\n"
      "# TYPE vllm:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = finished_by_reason_.find(reason);
    out += fmt::format("vllm:request_success_total{} {}\n",
                       labels(model, fmt::format("finished_reason=\"{}\"", reason)),
                       it == finished_by_reason_.end() ? 0 : it->second);
  }
  out +=
      "# HELP crl:http_responses_total HTTP responses by status code.\n"
      "# TYPE crl:http_responses_total counter\n";
  for (const auto& [status, n] : http_status_) {
    out += fmt::format("crl:http_responses_total{{code=\"{}\"}} {}\n", status, n);
  }
  ttft_.render("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", out);
  itl_.render("vllm:inter_token_latency_seconds", "Time between two steps producing tokens.", out);
  e2e_.render("vllm:e2e_request_latency_seconds", "Time from arrival to finish.", out);
  return out;
}

}  // namespace crl::server

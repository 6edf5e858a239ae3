#include "engine/sampling_params.h"

#include <charconv>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/check.h"

namespace crl::engine {
namespace {

constexpr int32_t kMaxN = 1024;
constexpr int32_t kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 16;

// Shortest text that reads back as `v` ("1.5", "0.1", "nan", "inf").
std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string format_value(double v) { return format_double(v); }
std::string format_value(int64_t v) { return std::to_string(v); }
std::string format_value(const std::string& v) { return "\"" + v + "\""; }

template <typename T>
[[noreturn]] void fail(const char* field, const T& value, const std::string& rule) {
  throw std::invalid_argument(std::string("invalid sampling parameter '") + field +
                              "': " + format_value(value) + " (" + rule + ")");
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  CRL_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  const std::string vocab = std::to_string(vocab_size);

  if (n < 1 || n > kMaxN) fail("n", int64_t{n}, "must be in [1, 1024]");
  if (!std::isfinite(temperature) || temperature < 0.0) {
    fail("temperature", temperature, "must be finite and >= 0");
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) fail("top_p", top_p, "must be in (0, 1]");
  if (top_k < -1 || top_k > vocab_size) {
    fail("top_k", int64_t{top_k}, "must be -1 or 0 (off) or in [1, " + vocab + "]");
  }
  if (!(min_p >= 0.0 && min_p <= 1.0)) fail("min_p", min_p, "must be in [0, 1]");
  if (!(repetition_penalty >= 0.01 && repetition_penalty <= 100.0)) {
    fail("repetition_penalty", repetition_penalty, "must be in [0.01, 100] (1 = off)");
  }
  if (!(frequency_penalty >= -2.0 && frequency_penalty <= 2.0)) {
    fail("frequency_penalty", frequency_penalty, "must be in [-2, 2]");
  }
  if (!(presence_penalty >= -2.0 && presence_penalty <= 2.0)) {
    fail("presence_penalty", presence_penalty, "must be in [-2, 2]");
  }
  if (max_tokens < 1) fail("max_tokens", int64_t{max_tokens}, "must be >= 1");
  if (min_tokens < 0 || min_tokens > max_tokens) {
    fail("min_tokens", int64_t{min_tokens},
         "must be in [0, max_tokens] = [0, " + std::to_string(max_tokens) + "]");
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      fail("stop_token_ids", int64_t{id}, "must be in [0, " + vocab + ")");
    }
  }
  if (stop.size() > kMaxStopStrings) {
    fail("stop", static_cast<int64_t>(stop.size()), "at most 16 stop strings");
  }
  for (const std::string& s : stop) {
    if (s.empty()) fail("stop", s, "stop strings must be non-empty");
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    fail("logprobs", int64_t{logprobs}, "must be in [0, 20]");
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    fail("prompt_logprobs", int64_t{*prompt_logprobs}, "must be in [0, 20]");
  }
}

}  // namespace crl::engine

// Request helpers shared by the engine's end-to-end tests.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/llm_engine.h"

namespace crl::test {

// `n` token ids drawn uniformly from [4, 500] (past the test models' special tokens).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> d(4, 500);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = d(rng);
  return out;
}

// A greedy request for exactly `max_tokens` tokens (EOS ignored).
inline engine::GenerateRequest greedy(const std::string& id, std::vector<int32_t> prompt,
                                      int max_tokens) {
  engine::GenerateRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// Two engines' outputs of the same requests: the same tokens, raw log-probs within `atol`.
inline void expect_same_outputs(const std::vector<engine::RequestOutput>& a,
                                const std::vector<engine::RequestOutput>& b, double atol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids) << a[i].request_id;
    const auto& x = a[i].outputs[0].raw_logprobs;
    const auto& y = b[i].outputs[0].raw_logprobs;
    ASSERT_EQ(x.size(), y.size()) << a[i].request_id;
    for (size_t t = 0; t < x.size(); ++t)
      EXPECT_NEAR(x[t], y[t], atol) << a[i].request_id << " @" << t;
  }
}

}  // namespace crl::test

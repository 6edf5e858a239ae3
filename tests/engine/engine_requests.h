// Request helpers shared by the engine's end-to-end tests.
#pragma once

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

}  // namespace crl::test

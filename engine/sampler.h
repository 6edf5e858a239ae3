// Sampler: turns one row of logits per sample into a token, with RL-grade log-probs.
//
// For each row it computes
//   raw log-prob:       log_softmax(logits)[token] at temperature 1 over the full vocabulary;
//   processed log-prob: log p(token) under the distribution actually sampled from, i.e. after
//                       the penalties, banned ids (min_tokens), temperature, top_k, top_p and
//                       min_p, renormalised (0 for greedy);
//   top log-probs:      the `logprobs` most likely tokens by raw log-prob, when asked.
// Filter order: penalties -> banned ids -> temperature -> top_k -> top_p -> min_p. The penalties
// (SamplingParams) change the logits the processed distribution and greedy see, never the raw
// log-probs.
// Randomness: one uniform per row from a counter-based hash of (seed, sample_index, position),
// then an inverse-CDF draw over token ids in ascending order: no global RNG state, so results do
// not depend on batch composition or order.
//
// Thread safety: stateless; callable from any thread.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/sampling_params.h"

namespace crl::engine {

// One token id's penalty in a row: its logit v becomes (v > 0 ? v / rep : v * rep) + add.
struct PenaltyEntry {
  int32_t id = 0;
  float rep = 1.0f;  // repetition_penalty when the id is in the prompt or output, else 1
  float add = 0.0f;  // -(frequency_penalty * count + presence_penalty) for an id generated so far
};

// The penalty entries of a sequence (sorted by id) from its prompt ids and the ids it generated:
// empty when `params` has no penalties.
std::vector<PenaltyEntry> penalty_entries(const SamplingParams& params,
                                          const std::vector<int32_t>& tokens, int64_t prompt_len);

// A logit after its penalty.
inline float penalized(float v, const PenaltyEntry& e) {
  return (v > 0 ? v / e.rep : v * e.rep) + e.add;
}

struct SampleRow {
  int64_t logits_row = 0;                  // row of the logits tensor to sample from
  const SamplingParams* params = nullptr;  // not owned
  uint64_t seed = 0;                       // the request's effective seed
  int32_t sample_index = 0;                // which of the n samples
  int64_t position = 0;                    // position of the token being sampled
  const std::vector<int32_t>* banned =
      nullptr;  // ids masked for this row (min_tokens), may be null
  const std::vector<PenaltyEntry>* penalties = nullptr;  // may be null or empty
};

struct SampleResult {
  int32_t token = 0;
  float raw_logprob = 0;
  float processed_logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // raw, most likely first
};

// logits: [R, V] float32, contiguous, CPU. One result per row, in order; rows run in parallel.
std::vector<SampleResult> sample_tokens(const at::Tensor& logits,
                                        const std::vector<SampleRow>& rows);

// The uniform in [0, 1) used for (seed, sample_index, position). Exposed for tests.
double sample_uniform(uint64_t seed, int32_t sample_index, int64_t position);

// Raw log-probs of `tokens` under each row of `logits` ([R, V] float32) plus the top `k` per row,
// computed row by row (used for prompt log-probs). Returns pairs (logprob of token, top-k list).
std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> token_logprobs(
    const at::Tensor& logits, const std::vector<int32_t>& tokens, int32_t k);

// Log-probs of `tokens` under each row of `logits` ([R, V] float32) at `temperature` (> 0), the
// distribution softmax(logits / T): at 1 the raw log-prob (token_logprobs'), otherwise the
// processed log-prob sample_tokens reports for a row sampled at that temperature with no
// penalty, banned id or top_k / top_p / min_p filter, bit for bit (an RL trainer's `old`).
std::vector<float> tempered_logprobs(const at::Tensor& logits, const std::vector<int32_t>& tokens,
                                     double temperature);

}  // namespace crl::engine

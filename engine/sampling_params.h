// SamplingParams: per-request generation options (vLLM/OpenAI names and meanings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace crl::engine {

struct SamplingParams {
  // Number of samples generated from the prompt; they share the prompt's KV blocks.
  int32_t n = 1;
  // Softmax temperature; 0 means greedy (argmax, processed log-prob 0).
  double temperature = 1.0;
  // Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p (1 =
  // off).
  double top_p = 1.0;
  // Keep only the top_k most likely tokens (0 or -1 = off).
  int32_t top_k = 0;
  // Drop tokens whose probability is below min_p times the most likely token's (0 = off).
  double min_p = 0.0;
  // Penalties on the logits before temperature and the filters, as vLLM and OpenAI define them:
  // a token id that occurs in the prompt or the output so far has its logit divided by
  // repetition_penalty when positive, multiplied when not (1 = off; [0.01, 100]); a token id
  // generated c > 0
  // times so far loses frequency_penalty * c + presence_penalty (0 = off; [-2, 2]).
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  // Seed of this request's random stream; unset = drawn by the engine. Streams are keyed by
  // (seed, sample index, position), so outputs do not depend on batch composition.
  std::optional<uint64_t> seed;
  // Maximum number of generated tokens per sample.
  int32_t max_tokens = 16;
  // EOS and stop_token_ids are masked until this many tokens were generated.
  int32_t min_tokens = 0;
  // Keep generating past EOS (stop_token_ids still stop).
  bool ignore_eos = false;
  // Token ids that end a sample (the stop token is kept in the output ids).
  std::vector<int32_t> stop_token_ids;
  // Strings that end a sample; the text is cut before the stop string.
  std::vector<std::string> stop;
  // Also return the top `logprobs` raw log-probs at every sampled position (0 = none, max 20).
  int32_t logprobs = 0;
  // Return raw log-probs of the prompt tokens (and their top `prompt_logprobs`); unset = none.
  std::optional<int32_t> prompt_logprobs;
  // Skip special tokens when detokenizing.
  bool skip_special_tokens = true;

  // Throws std::invalid_argument naming the field and value.
  void validate(int64_t vocab_size) const;

  bool is_greedy() const { return temperature <= 0.0; }
  bool has_penalties() const {
    return repetition_penalty != 1.0 || frequency_penalty != 0.0 || presence_penalty != 0.0;
  }
};

}  // namespace crl::engine

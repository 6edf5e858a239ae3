// RL and SFT losses over the loss tokens of a micro-batch (pure tensor functions).
//
// Every per-token argument is [N] float32 over the N loss (completion) tokens of one micro-batch,
// in token order; losses are token-level means over those N tokens.
//
// GRPO / PPO-clip (docs/design.md §5 step 4), per token with ratio r = exp(logp - old):
//   pg  = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
//   old = the engine's log-prob of the token under the distribution it sampled from (the behaviour
//         policy): the raw log-prob at temperature 1, the processed one at
//         GrpoOptions::temperature.
// Truncated importance sampling (tis_cap > 0, off by default), for the engine/trainer mismatch: the
// trainer's own log-prob at the current weights (detached) becomes `old`, and each token's pg is
// weighted by min(exp(old_trainer - old_engine), tis_cap). One optimizer step per rollout batch is
// assumed (the weights that sampled are the weights the trainer starts from). With asynchronous
// rollouts
// (--max-staleness K >= 1) this is the decoupled PPO objective (AReaL): the proximal policy is the
// trainer's weights at the start of the step, the behaviour policy the engine's log-probs, and
// with one optimizer step per batch the ratio to the proximal policy is 1 in value.
// KL to a frozen reference (kl_coef > 0), k3 estimator: exp(ref - logp) - (ref - logp) - 1.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace crl::engine {
class Transformer;
}

namespace crl::trainer {

struct GrpoOptions {
  // Lower clip range: the ratio is clipped below at 1 - clip_low.
  double clip_low = 0.2;
  // Upper clip range: the ratio is clipped above at 1 + clip_high.
  double clip_high = 0.2;
  // Weight of the k3 KL to the reference model (0 = no reference model).
  double kl_coef = 0.0;
  // Truncated importance-sampling cap C (0 = off).
  double tis_cap = 0.0;
  // The rollouts' sampling temperature T (> 0). GRPO's log-probs (the policy's, the reference's,
  // compute_logprobs') are those of softmax(logits / T), the distribution the engine sampled the
  // tokens from, and `old` is the engine's log-prob under it (verl and TRL score at the rollout
  // temperature too); at 1 the logits are used as they are. The SFT loss always scores at 1.
  double temperature = 1.0;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

// Scalars of one loss evaluation (sums are combined by the trainer over micro-batches).
struct LossMetrics {
  double loss = 0;              // token-mean loss
  double kl = 0;                // token-mean k3 KL to the reference (0 without one)
  double clip_fraction = 0;     // fraction of tokens with |r - 1| beyond the clip range
  double logprob_gap_max = 0;   // max |engine raw logprob - trainer logprob|
  double logprob_gap_mean = 0;  // mean of the same
  // KL(engine || trainer) over the sampled tokens (the engine's log-probs are the behaviour
  // policy's): mismatch_kl = mean(engine - trainer), mismatch_k3_kl = mean(e^d - d - 1) with
  // d = trainer - engine (verl's rollout_corr/kl and rollout_corr/k3_kl).
  double mismatch_kl = 0;
  double mismatch_k3_kl = 0;
  double is_weight_mean = 0;  // with tis_cap: mean of exp(trainer - engine) before truncation
  double is_weight_max = 0;   // with tis_cap: max of the same
  int64_t num_tokens = 0;     // N
  // Token-mean entropy (nats) of the trainer's next-token distributions at the loss tokens, at the
  // scoring temperature (verl's actor/entropy); 0 where the caller did not ask (target_logprobs).
  double entropy = 0;
};

// The metrics of one step from its micro-batches' (the one aggregator of the trainer, the RL
// consumer and the report): loss and KL are means over micro-batches; clip fraction, gap mean,
// the mismatch KLs and IS-weight mean are token-weighted; the maxima are maxima; num_tokens is the
// sum.
LossMetrics combine_loss_metrics(const std::vector<LossMetrics>& parts);

struct LossOutput {
  at::Tensor loss;  // scalar, differentiable
  LossMetrics metrics;
};

// logprobs: trainer log-probs (with grad); old_logprobs: the engine's (behaviour) log-probs;
// advantages: per token; ref_logprobs: reference model log-probs, undefined when kl_coef == 0.
LossOutput grpo_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs,
                     const at::Tensor& advantages, const at::Tensor& ref_logprobs,
                     const GrpoOptions& options);

// Cross-entropy on completion tokens: -mean(logprobs). old_logprobs may be undefined (no gap
// metric then).
LossOutput sft_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs);

// The rows j of a micro-batch's tokens that carry loss (loss_mask[j] != 0), int64 [N]: their
// logits are row j - 1's. Only these rows' logits are computed and enter a loss, so a token off
// the mask (a prompt, tool or environment token: weight exactly 0) has no part in the loss or its
// gradient, whatever its logits, log-prob or advantage.
at::Tensor loss_token_rows(const at::Tensor& loss_mask);

// Log-probs [N] of `targets` [N] under softmax(`logits` / temperature) ([N, V] float32; at
// temperature 1 the logits as they are), differentiable through log_softmax. When match_engine is
// set (CPU logits), the *values* are the engine sampler's log-probs of that distribution
// (engine::tempered_logprobs: same max, exp polynomial and summation order), bit for bit, while
// the gradient is log_softmax's: value = engine + (ls - ls.detach()). With entropy_sum, adds the
// summed entropy (nats, no gradient) of the N rows' distributions to *entropy_sum.
at::Tensor target_logprobs(const at::Tensor& logits, const at::Tensor& targets, bool match_engine,
                           double* entropy_sum = nullptr, double temperature = 1.0);

// Rows of logits head_target_logprobs computes at once: `option` where > 0, else (0) as many as
// make 1 GiB of fp32 logits at a vocabulary of `vocab` (at least 64 rows).
int64_t logits_chunk_rows(int64_t option, int64_t vocab);

// target_logprobs(model.compute_logits(hidden), targets, match_engine, entropy_sum, temperature),
// `chunk_rows` rows of hidden [N, H] at a time, so the fp32 logits of all N rows, their
// log-softmax and its gradient never exist at once. Where the result needs a gradient, the forward
// keeps only the log-probs (and `hidden`) and backward recomputes each chunk's logits to
// differentiate them: one more LM-head product per row, the head's gradient summed over the chunks
// (in fp32) and handed on once. Values are target_logprobs' row for row (bit for bit in
// deterministic mode; elsewhere the CPU may pick another linear kernel for a chunk's row count);
// gradients equal up to the order of that sum. N <= chunk_rows is target_logprobs itself (nothing
// recomputed).
at::Tensor head_target_logprobs(const engine::Transformer& model, const at::Tensor& hidden,
                                const at::Tensor& targets, int64_t chunk_rows, bool match_engine,
                                double* entropy_sum = nullptr, double temperature = 1.0);

}  // namespace crl::trainer

// Tensor sampler: the sampler of engine/sampler.h written in tensor operations, so it runs where
// the logits are (a GPU). Only the sampled ids, their raw and processed log-probs and the top
// log-probs a row asked for come back to the host: one device->host copy of R * (4 + K * 2) int32
// words for R rows and K = the largest `logprobs` asked, instead of the R x vocab logits.
//
// Same contract as sample_tokens(): the same filters in the same order (banned ids -> temperature
// -> top_k -> top_p -> min_p), the same kept set (ranked by probability, ties by smaller id), the
// same uniform per row (sample_uniform(seed, sample_index, position): a counter-based stream, so a
// seed reproduces a request's samples whatever its batch neighbours) and the same inverse-CDF
// draw over token ids in ascending order. Sums run in other orders than the CPU sampler's (float
// logsumexp, a float64 prefix sum), so log-probs agree to ~1e-6 and a draw can differ only where
// the uniform falls within rounding of a CDF step. NaN logits and rows with no finite maximum
// are errors naming the row, as on the CPU (checked after the one copy, not by an extra sync).
//
// Cost on a device: a few passes over the [R, V] logits (max, logsumexp, exp, prefix sum, one
// search); rows with top_k or top_p also sort their row (stable, descending). Greedy-only batches
// skip the exp and the prefix sum.
//
// Thread safety: stateless; callable from any thread.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace crl::engine {

struct TensorSamplerStats {
  int64_t h2d_bytes = 0;  // the rows' parameters, one upload
  int64_t d2h_bytes = 0;  // the results, one download
};

// logits: [R, V] float32 or bfloat16 on any device. One result per row, in order.
// `fused`: on a CUDA device, a batch whose rows use no top-k, top-p, min-p, banned ids or top
// log-probs runs as one kernel (kernels::cuda_sample_plain_rows: the same draws up to the order of
// its double sums); false keeps the tensor ops (the baseline `bench rollout` compares).
std::vector<SampleResult> sample_tokens_tensor(const at::Tensor& logits,
                                               const std::vector<SampleRow>& rows,
                                               TensorSamplerStats* stats = nullptr,
                                               bool fused = true);

// Tests: the kept set of each row's processed distribution after its filters, [rows, V] bool on
// the logits' device (all true for a greedy row).
at::Tensor tensor_sampler_kept_mask(const at::Tensor& logits, const std::vector<SampleRow>& rows);

}  // namespace crl::engine

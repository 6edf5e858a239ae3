// AttentionBackend: how a Transformer layer turns (q, k, v) of the current tokens into attention
// output. The model code is written once and parameterised by the backend:
//   DenseCausalAttention — packed full sequences (cu_seqlens), plain differentiable libtorch ops;
//   the
//                          trainer and the no-cache reference forward use it;
//   PagedKvAttention     — (engine/model_runner.h) writes K/V into the paged cache and attends
//                          through block tables.
// Passed explicitly to every forward (no global per-step state).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <vector>

namespace crl::engine {

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // q: [T, num_heads, head_dim], k, v: [T, num_kv_heads, head_dim] after RoPE, for layer `layer`.
  // Returns [T, num_heads, head_dim].
  virtual at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) = 0;
};

// Where DenseCausalAttention runs libtorch 2.x's fused scaled_dot_product_attention (on a GPU its
// memory-efficient kernel, in float32 like the composed path: no [H, L, L] scores in memory, which
// the composed ops hold per layer for the backward) in place of the composed ops: for CUDA tensors
// (the default), for every tensor (tests compare the two on the CPU), or never. Against
// libtorch 1.x (Debian's) the fused path is not compiled and the composed ops always run.
enum class FusedAttention { kNever, kOnCuda, kAlways };

// Causal self-attention over packed sequences: rows [cu[i], cu[i+1]) form sequence i, positions
// start at 0. Scores are computed in float32. Differentiable.
class DenseCausalAttention : public AttentionBackend {
 public:
  explicit DenseCausalAttention(std::vector<int64_t> seq_lens,
                                FusedAttention fused = FusedAttention::kOnCuda);
  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) override;
  // True when this build's libtorch has scaled_dot_product_attention (>= 2.0).
  static bool fused_available();

 private:
  at::Tensor attend_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;

  std::vector<int64_t> seq_lens_;
  FusedAttention fused_;
  std::map<int64_t, at::Tensor> bias_;  // causal bias [L, L] per sequence length
};

}  // namespace crl::engine

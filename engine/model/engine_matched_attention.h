// EngineMatchedAttention: a differentiable attention backend whose forward values are the engine's
// paged-attention kernel's, bit for bit.
//
// The engine attends through kv::paged_attention, whose per-row reduction order depends only on
// the position; libtorch's dense softmax(QK^T)V (DenseCausalAttention) computes the same function
// with different rounding. For the trainer to reproduce the engine's log-probs exactly (the
// engine's deterministic mode), this backend runs the paged kernel over the packed sequences
// (K/V viewed as a cache with one-token blocks, no copy) for the values and DenseCausalAttention
// for the gradient: out = paged + (dense - dense.detach()). Both compute the same attention, so the
// gradient is that of the forward up to float rounding.
//
// Costs one extra attention pass per layer; used only when the trainer runs deterministic.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/model/attention.h"

namespace crl::engine {

class EngineMatchedAttention : public AttentionBackend {
 public:
  // seq_lens: packed independent sequences, positions restart at 0 in each.
  explicit EngineMatchedAttention(std::vector<int64_t> seq_lens);
  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) override;

 private:
  std::vector<int64_t> seq_lens_;
  DenseCausalAttention dense_;
  at::Tensor query_start_, context_lens_, block_tables_, slot_mapping_;  // int32 / int64, CPU
  int64_t max_len_ = 0;
};

}  // namespace crl::engine

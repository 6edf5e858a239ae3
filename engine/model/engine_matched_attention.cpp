#include "engine/model/engine_matched_attention.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "kv/paged_attention.h"

namespace crl::engine {

EngineMatchedAttention::EngineMatchedAttention(std::vector<int64_t> seq_lens)
    : seq_lens_(std::move(seq_lens)), dense_(seq_lens_, FusedAttention::kNever) {
  const int64_t s = static_cast<int64_t>(seq_lens_.size());
  for (int64_t len : seq_lens_) max_len_ = std::max(max_len_, len);
  query_start_ = at::empty({s + 1}, at::kInt);
  context_lens_ = at::empty({s}, at::kInt);
  // One-token blocks: row r of the packed batch is cache block r, so sequence i's block table is
  // [cu[i], cu[i] + len_i).
  block_tables_ = at::zeros({s, std::max<int64_t>(max_len_, 1)}, at::kInt);
  int32_t* qs = query_start_.data_ptr<int32_t>();
  int32_t* cl = context_lens_.data_ptr<int32_t>();
  int32_t* bt = block_tables_.data_ptr<int32_t>();
  int64_t row = 0;
  for (int64_t i = 0; i < s; ++i) {
    qs[i] = static_cast<int32_t>(row);
    cl[i] = static_cast<int32_t>(seq_lens_[i]);
    for (int64_t p = 0; p < seq_lens_[i]; ++p) bt[i * block_tables_.size(1) + p] = row + p;
    row += seq_lens_[i];
  }
  qs[s] = static_cast<int32_t>(row);
  slot_mapping_ = at::arange(row, at::kLong);
}

at::Tensor EngineMatchedAttention::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v) {
  at::Tensor dense = dense_.attend(layer, q, k, v);
  at::Tensor paged;
  {
    at::NoGradGuard no_grad;
    const auto dev = q.device();
    kv::PagedAttentionMetadata meta;
    meta.slot_mapping = slot_mapping_.to(dev);
    meta.query_start = query_start_.to(dev);
    meta.context_lens = context_lens_.to(dev);
    meta.block_tables = block_tables_.to(dev);
    meta.max_query_len = max_len_;
    meta.max_context_len = max_len_;
    // [T, kv_heads, head_dim] -> a cache of T one-token blocks (a view, no copy).
    at::Tensor k_cache = k.detach().contiguous().unsqueeze(1);
    at::Tensor v_cache = v.detach().contiguous().unsqueeze(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
    paged = kv::paged_attention(q.detach().contiguous(), k_cache, v_cache, meta, scale);
  }
  if (!dense.requires_grad()) return paged;
  return paged + (dense - dense.detach());
}

}  // namespace crl::engine

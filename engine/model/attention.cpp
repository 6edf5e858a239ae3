#include "engine/model/attention.h"

#include <torch/version.h>

#include <cmath>
#include <limits>

#include "common/check.h"

// scaled_dot_product_attention came with libtorch 2.0; Debian's 1.13 has none.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
#define CRL_HAS_SDPA 1
#else
#define CRL_HAS_SDPA 0
#endif

namespace crl::engine {

DenseCausalAttention::DenseCausalAttention(std::vector<int64_t> seq_lens, FusedAttention fused)
    : seq_lens_(std::move(seq_lens)), fused_(fused) {}

bool DenseCausalAttention::fused_available() { return CRL_HAS_SDPA; }

at::Tensor DenseCausalAttention::attend_fused(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v) const {
#if CRL_HAS_SDPA
  const int64_t group = q.size(1) / k.size(1);
  std::vector<at::Tensor> outs;
  outs.reserve(seq_lens_.size());
  int64_t start = 0;
  for (int64_t len : seq_lens_) {
    // [1, H, L, D] in float32, as the composed path computes its scores.
    auto qs = q.narrow(0, start, len).transpose(0, 1).unsqueeze(0).to(at::kFloat);
    auto ks = k.narrow(0, start, len).transpose(0, 1).unsqueeze(0).to(at::kFloat);
    auto vs = v.narrow(0, start, len).transpose(0, 1).unsqueeze(0).to(at::kFloat);
    if (group > 1) {
      ks = ks.repeat_interleave(group, 1);
      vs = vs.repeat_interleave(group, 1);
    }
    auto o = at::scaled_dot_product_attention(qs, ks, vs, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/true);
    outs.push_back(o.squeeze(0).transpose(0, 1).to(q.scalar_type()));  // [L, H, D]
    start += len;
  }
  CRL_CHECK(start == q.size(0), "seq_lens sum ", start, " != rows ", q.size(0));
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
#else
  CRL_CHECK(false, "scaled_dot_product_attention needs libtorch >= 2.0 (this build has ",
            TORCH_VERSION, ")");
#endif
}

at::Tensor DenseCausalAttention::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v) {
  if (CRL_HAS_SDPA &&
      (fused_ == FusedAttention::kAlways || (fused_ == FusedAttention::kOnCuda && q.is_cuda()))) {
    return attend_fused(q, k, v);
  }
  const int64_t heads = q.size(1);
  const int64_t kv_heads = k.size(1);
  const int64_t head_dim = q.size(2);
  CRL_CHECK(heads % kv_heads == 0, "heads ", heads, " kv_heads ", kv_heads);
  const int64_t group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<at::Tensor> outs;
  outs.reserve(seq_lens_.size());
  int64_t start = 0;
  for (int64_t len : seq_lens_) {
    auto qs = q.narrow(0, start, len).transpose(0, 1).to(at::kFloat);  // [H, L, D]
    auto ks = k.narrow(0, start, len).transpose(0, 1).to(at::kFloat);  // [KV, L, D]
    auto vs = v.narrow(0, start, len).transpose(0, 1).to(at::kFloat);
    if (group > 1) {
      ks = ks.repeat_interleave(group, 0);
      vs = vs.repeat_interleave(group, 0);
    }
    // scale * q k^T + the causal bias (-inf above the diagonal) in one GEMM: one [H, L, L]
    // tensor besides the probabilities (a fresh allocation of that size costs more in page
    // faults than the GEMM itself at long L). The bias is built once per length, for all layers.
    at::Tensor& bias = bias_[len];
    if (!bias.defined()) {
      bias = at::zeros({len, len}, qs.options())
                 .masked_fill_(at::ones({len, len}, qs.options().dtype(at::kBool)).triu(1),
                               -std::numeric_limits<float>::infinity());
    }
    auto scores = at::baddbmm(bias.expand({qs.size(0), len, len}), qs, ks.transpose(1, 2),
                              /*beta=*/1, /*alpha=*/scale);  // [H, L, L]
    auto probs = at::softmax(scores, -1);
    outs.push_back(at::matmul(probs, vs).transpose(0, 1).to(q.scalar_type()));  // [L, H, D]
    start += len;
  }
  CRL_CHECK(start == q.size(0), "seq_lens sum ", start, " != rows ", q.size(0));
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

}  // namespace crl::engine

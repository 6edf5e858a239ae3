// Fused CUDA kernels for the Transformer's row-wise and elementwise ops on a GPU: one launch each
// where the ATen composition in Transformer takes five (RMSNorm), two (the SiLU gate) or fourteen
// (RoPE of q and k) kernels and as many round trips through device memory. A decode step's ops
// are small, so on a GPU their count, not their bytes, sets the step time.
//
// Each computes what the ATen composition computes, with the same roundings to the compute dtype
// between steps (bfloat16: every ATen op rounds its float result; these round at the same points),
// so their results equal ATen's up to the reduction order of RMSNorm's sum of squares.
//
// Built with CUDA only (engine/kernels/cuda_ops.cu); elsewhere cuda_ops_built() is false and the
// ops throw. Inputs: CUDA tensors, float32 or bfloat16, contiguous, one dtype (checked).
#pragma once

#include <ATen/ATen.h>

namespace crl::engine::kernels {

// True in builds with the CUDA kernels.
bool cuda_ops_built();

// x [R, H], weight [H]: (x * rsqrt(mean(x^2) + eps)).to(dtype) * weight, the sum in float32.
at::Tensor cuda_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// gate, up [R, I]: silu(gate) * up, contiguous [R, I]. Each input's rows may lie apart (the two
// halves of a merged gate/up product), read in place.
at::Tensor cuda_silu_mul(const at::Tensor& gate, const at::Tensor& up);

// In place: q [T, Hq, D] and k [T, Hk, D] rotated by RoPE (Hugging Face's rotate_half: the first
// and second halves of each head are the pair) at `positions` [T] int64, from the float32 tables
// cos_table, sin_table [P, D / 2] (rounded to the compute dtype first, as the ATen path does).
// Each token's heads are contiguous; tokens may lie apart (rows of a merged q/k/v product).
void cuda_rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& positions,
                const at::Tensor& cos_table, const at::Tensor& sin_table);

}  // namespace crl::engine::kernels

namespace crl::engine::kernels {

// The tensor sampler's (engine/tensor_sampler.h) plain rows in one kernel: rows with no top-k,
// top-p, min-p, banned ids or top log-probs. logits [N, V] float32 (contiguous); params [8, R]
// float64 in the tensor sampler's field order (logits row, scale, 1/T, top-k, top-p, min-p,
// uniform, greedy). Returns [4, R] int32: the token (argmax for greedy rows; else the first id
// whose running sum of exp((x - max) * scale), in double, exceeds uniform * the total, as the
// tensor sampler's inverse CDF in id order), the raw log-prob and the processed one (float32 bits),
// and 1 where the row has a NaN or no finite maximum. Two passes over each row instead of a dozen.
at::Tensor cuda_sample_plain_rows(const at::Tensor& logits, const at::Tensor& params);

}  // namespace crl::engine::kernels

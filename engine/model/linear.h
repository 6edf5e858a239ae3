// apply_linear(): y = x W^T + b for the model's projections, with a bandwidth-bound CPU path for
// the few-row case (decode at small batch) where BLAS GEMM packs the whole weight matrix on every
// call. Falls back to at::linear whenever autograd needs the graph, on CUDA, or for more rows.
#pragma once

#include <ATen/ATen.h>

namespace crl::engine {

// Rows at or below which the CPU GEMV path is used.
constexpr int64_t kGemvMaxRows = 8;

// x: [M, K], weight: [N, K], bias: [N] or undefined. Same result contract as at::linear.
at::Tensor apply_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

namespace detail {
// The CPU GEMV kernel: x [M, K] float32 or bfloat16 (same dtype as weight), contiguous.
at::Tensor gemv_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
}  // namespace detail

}  // namespace crl::engine

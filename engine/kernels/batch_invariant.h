// Batch-invariant CPU kernels: the project's own linear, RMSNorm and SiLU-gate, used by
// deterministic mode (docs/design.md §8) in the engine and in the trainer's forward.
//
// Contract: every output element is computed by a fixed sequence of float32 operations that
// depends only on its own row (or element) and the weights: not on the number of rows, the row's
// position in the batch, its neighbours, the thread count, or which instruction-set path runs
// (AVX-512, AVX2 or scalar; engine/kernels/cpu_isa.h). So a token's activations are bit-identical
// whatever batch it is computed in, and identical on every x86-64 CPU that runs the same build.
// The exact formulas are in engine/kernels/bi_kernels.h. None of these record autograd history
// (engine/model/deterministic_ops.h adds it).
//
// Inputs: CPU, float32 or bfloat16, contiguous where stated; outputs in the input dtype.
// Thread safety: reentrant; they parallelise internally with at::parallel_for.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace crl::engine::kernels {

// y = x w^T + b. x: [M, K], weight: [N, K] (same dtype as x), bias: [N] or undefined. y: [M, N].
// With x2 [M, K2] (float32 or bfloat16) and weight2 [N, K2] (weight's dtype) defined:
// y = [x | x2] [weight | weight2]^T + b, bit for bit bi_linear of the concatenations without
// making them: a LoRA adapter's delta (x A^T) (s B)^T inside the base product.
at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                     const at::Tensor& x2 = {}, const at::Tensor& weight2 = {});

// Rows [begin, end) of a grouped product and the weight they use (see each function for an
// undefined one). A call's groups cover its rows in order: the first begins at 0, each begins where
// the one before ends, the last ends at M; a group may be empty.
struct RowGroup {
  int64_t begin = 0, end = 0;
  at::Tensor weight;
};

// Each group's rows times its own weight: y[r] = x[r] weight_g^T, bit for bit bi_linear of the
// group's rows alone; rows of a group without a weight are zero. x: [M, K]; each weight: a
// contiguous [n, K] of x's dtype. One parallel region for all groups (rows of several LoRA
// adapters: each row's x A^T with its own adapter's A).
at::Tensor bi_grouped_linear(const at::Tensor& x, const std::vector<RowGroup>& groups, int64_t n);

// bi_linear with a second depth segment per row group: the rows of a group with weight2 W2_g
// (contiguous [N, K2], weight's dtype) are [x | x2] [weight | W2_g]^T + b, those of a group
// without one x weight^T + b (their x2 unread), each bit for bit bi_linear of the row alone with
// its own segments. x2: [M, K2]; x needs K > 0. Several LoRA adapters' up-projections in one
// product, each row reading only its own adapter's B.
at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& x2, const std::vector<RowGroup>& second);

// bi_linear for bfloat16 x and weight on a CPU with AVX512-BF16 (bf16_dot_supported(),
// engine/kernels/cpu_isa.h): vdpbf16ps, two depths per instruction. The same canonical chain and
// bits as bi_linear, except where a denormal occurs: bfloat16 denormal inputs read as zero and a
// denormal partial sum flushes to zero, as the instruction does. So it keeps batch invariance on
// one machine but not bit-identity with the other paths; deterministic mode does not use it.
// Throws when the CPU cannot run it. y: [M, N] bfloat16.
at::Tensor bf16_dot_linear(const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias = {});

// HF RMSNorm over the last dimension: y = (x * rsqrt(mean(x^2) + eps)).to(dtype) * weight.
// x: [..., H], weight: [H], same dtype.
at::Tensor bi_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// silu(gate) * up, elementwise (the SwiGLU gate), both rounded to the dtype as at::silu and mul do.
// gate, up: same shape and dtype; 2-D ones may have rows apart (the two halves of a merged gate/up
// product), read in place.
at::Tensor bi_silu_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace crl::engine::kernels

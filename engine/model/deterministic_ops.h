// Deterministic-mode versions of the Transformer's row-wise ops: the values of the batch-invariant
// kernels (engine/kernels/batch_invariant.h), with gradients when an input requires grad, so the
// trainer's forward reproduces the engine's activations bit for bit while still training.
//
// Gradients are libtorch's (the backward of at::linear / the RMSNorm / the SiLU gate written in
// ATen ops): they are the gradients of the same function up to float rounding, and need not be
// batch-invariant. Without grad these are exactly the kernels, at no extra cost.
#pragma once

#include <ATen/ATen.h>

namespace crl::engine {

// y = x w^T + b; x [M, K], weight [N, K], bias [N] or undefined.
at::Tensor det_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// y = x w^T + b by the project's linear kernel forward and backward (the backward's two matmuls as
// the same kernel on transposed copies): the trainer's float32 CPU path outside deterministic mode.
at::Tensor kernel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// HF RMSNorm over the last dimension.
at::Tensor det_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// silu(gate) * up.
at::Tensor det_silu_mul(const at::Tensor& gate, const at::Tensor& up);

// The same functions in plain ATen ops (the fast path's definitions), shared with Transformer.
at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace crl::engine

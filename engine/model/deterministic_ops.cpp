#include "engine/model/deterministic_ops.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "engine/kernels/batch_invariant.h"

namespace crl::engine {
namespace {

bool needs_graph(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// Forward: the batch-invariant kernel. Backward: the matmuls of at::linear's backward, by libtorch
// (deterministic mode) or by the same kernel on transposed operands (kernel_linear). Separate
// Functions with and without bias (a custom Function's inputs must all be defined tensors).
at::Tensor linear_grad_x(torch::autograd::AutogradContext* ctx, const at::Tensor& gy,
                         const at::Tensor& weight) {
  if (!ctx->needs_input_grad(0)) return {};
  // gy [M, N] . weight [N, K] = gy . (weight^T)^T
  return ctx->saved_data["kernel_backward"].toBool()
             ? kernels::bi_linear(gy, weight.t().contiguous())
             : gy.mm(weight);
}
at::Tensor linear_grad_w(torch::autograd::AutogradContext* ctx, const at::Tensor& gy,
                         const at::Tensor& x) {
  if (!ctx->needs_input_grad(1)) return {};
  // gy^T [N, M] . x [M, K] = gy^T . (x^T)^T
  return ctx->saved_data["kernel_backward"].toBool()
             ? kernels::bi_linear(gy.t().contiguous(), x.t().contiguous())
             : gy.t().mm(x);
}

struct LinearFn : torch::autograd::Function<LinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, bool kernel_backward) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["kernel_backward"] = kernel_backward;
    return kernels::bi_linear(x, weight);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {linear_grad_x(ctx, grads[0], saved[1]), linear_grad_w(ctx, grads[0], saved[0]),
            at::Tensor()};
  }
};

struct LinearBiasFn : torch::autograd::Function<LinearBiasFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias,
                            bool kernel_backward) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["kernel_backward"] = kernel_backward;
    return kernels::bi_linear(x, weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor gb = ctx->needs_input_grad(2) ? grads[0].sum(0) : at::Tensor();
    return {linear_grad_x(ctx, grads[0], saved[1]), linear_grad_w(ctx, grads[0], saved[0]), gb,
            at::Tensor()};
  }
};

at::Tensor linear_with_grad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            bool kernel_backward) {
  return bias.defined() ? LinearBiasFn::apply(x, weight, bias, kernel_backward)
                        : LinearFn::apply(x, weight, kernel_backward);
}

// The kernel's values with `reference`'s gradient: value + (reference - reference.detach()) is
// exactly `value` (x - x == 0) and differentiates as `reference`.
at::Tensor with_gradient_of(const at::Tensor& value, const at::Tensor& reference) {
  return value + (reference - reference.detach());
}

}  // namespace

at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  auto normed = (xf * at::rsqrt(var + eps)).to(x.scalar_type());
  return normed * weight;
}

at::Tensor det_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!needs_graph({&x, &weight, &bias})) return kernels::bi_linear(x, weight, bias);
  return linear_with_grad(x, weight, bias, /*kernel_backward=*/false);
}

at::Tensor kernel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!needs_graph({&x, &weight, &bias})) return kernels::bi_linear(x, weight, bias);
  return linear_with_grad(x, weight, bias, /*kernel_backward=*/true);
}

at::Tensor det_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor value;
  {
    at::NoGradGuard no_grad;
    value = kernels::bi_rms_norm(x.detach(), weight.detach(), eps);
  }
  if (!needs_graph({&x, &weight})) return value;
  return with_gradient_of(value, aten_rms_norm(x, weight, eps));
}

at::Tensor det_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor value;
  {
    at::NoGradGuard no_grad;
    value = kernels::bi_silu_mul(gate.detach(), up.detach());
  }
  if (!needs_graph({&gate, &up})) return value;
  return with_gradient_of(value, at::silu(gate) * up);
}

}  // namespace crl::engine

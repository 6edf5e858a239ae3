#include "engine/model/linear.h"

#include <ATen/core/grad_mode.h>

namespace crl::engine {

at::Tensor apply_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool needs_graph =
      at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!needs_graph && x.dim() == 2 && x.size(0) <= kGemvMaxRows && x.is_cpu() &&
      weight.is_contiguous() && x.scalar_type() == weight.scalar_type() &&
      (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16)) {
    return detail::gemv_cpu(x.contiguous(), weight, bias);
  }
  return at::linear(x, weight, bias);
}

}  // namespace crl::engine

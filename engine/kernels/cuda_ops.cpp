// Builds without CUDA: the fused CUDA ops are absent (the CUDA build compiles cuda_ops.cu instead).
#ifndef CRL_WITH_CUDA
#include "engine/kernels/cuda_ops.h"

#include <stdexcept>

namespace crl::engine::kernels {

namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error(
      "the fused CUDA ops need a CUDA build (this colocated-rl was built without CUDA)");
}
}  // namespace

bool cuda_ops_built() { return false; }
at::Tensor cuda_rms_norm(const at::Tensor&, const at::Tensor&, double) { no_cuda(); }
at::Tensor cuda_silu_mul(const at::Tensor&, const at::Tensor&) { no_cuda(); }
void cuda_rope_(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  no_cuda();
}
at::Tensor cuda_sample_plain_rows(const at::Tensor&, const at::Tensor&) { no_cuda(); }

}  // namespace crl::engine::kernels
#endif

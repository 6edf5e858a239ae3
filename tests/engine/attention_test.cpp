// DenseCausalAttention's fused path (libtorch 2.x's scaled_dot_product_attention, what the trainer
// runs on a GPU) against its composed ops: the same outputs and gradients over packed sequences of
// several lengths, grouped-query heads, float32 and bfloat16. On the CPU in the GPU build path
// (libtorch 2.11; Debian's 1.13 has no fused kernel and skips), on cuda:0 where one is present.
#include "engine/model/attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_utils.h"

namespace crl::engine {
namespace {

void fused_matches_composed(at::Device device) {
  const std::vector<int64_t> lens = {7, 1, 33, 16};
  const int64_t rows = 57, heads = 6, kv_heads = 2, dim = 32;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(5);
    auto opts = at::TensorOptions().dtype(dtype).device(device);
    at::Tensor q0 = at::randn({rows, heads, dim}, opts);
    at::Tensor k0 = at::randn({rows, kv_heads, dim}, opts);
    at::Tensor v0 = at::randn({rows, kv_heads, dim}, opts);
    at::Tensor up = at::randn({rows, heads, dim}, opts);
    std::vector<at::Tensor> outs, grads;
    for (FusedAttention f : {FusedAttention::kNever, FusedAttention::kAlways}) {
      at::Tensor q = q0.clone().requires_grad_(true);
      at::Tensor k = k0.clone().requires_grad_(true);
      at::Tensor v = v0.clone().requires_grad_(true);
      DenseCausalAttention attention(lens, f);
      at::Tensor out = attention.attend(0, q, k, v);
      ASSERT_EQ(out.sizes(), q.sizes());
      ASSERT_EQ(out.scalar_type(), dtype);
      (out.to(at::kFloat) * up.to(at::kFloat)).sum().backward();
      outs.push_back(out.to(at::kFloat).cpu());
      grads.push_back(at::cat({q.grad(), k.grad(), v.grad()}, 1).to(at::kFloat).cpu());
    }
    // Both compute in float32; bfloat16 inputs and outputs round once each way.
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    test::expect_tensor_near(outs[1], outs[0], tol, tol);
    test::expect_tensor_near(grads[1], grads[0], tol * 10, tol);
  }
}

TEST(DenseCausalAttentionTest, FusedMatchesComposedForwardAndBackward) {
  if (!DenseCausalAttention::fused_available()) {
    GTEST_SKIP() << "libtorch < 2.0: no scaled_dot_product_attention (the GPU build path has it)";
  }
  fused_matches_composed(at::kCPU);
}

TEST(CudaDenseCausalAttentionTest, FusedMatchesComposedForwardAndBackward) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(DenseCausalAttention::fused_available());
  fused_matches_composed(at::Device("cuda:0"));
}

}  // namespace
}  // namespace crl::engine

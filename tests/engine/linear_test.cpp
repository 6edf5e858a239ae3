// The few-row GEMV path (fast mode) against at::linear. Deterministic mode's kernels are tested in
// batch_invariant_test.cpp.
#include "engine/model/linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_utils.h"

namespace crl::engine {
namespace {

TEST(LinearTest, GemvPathMatchesAtLinearForFewRows) {
  at::manual_seed(1);
  for (int64_t rows : {1, 2, 3, 4, 5, 8}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 64}, {130, 77}, {576, 1536}}) {
      auto x = at::randn({rows, k});
      auto w = at::randn({n, k});
      auto b = at::randn({n});
      test::expect_tensor_near(apply_linear(x, w, b), at::linear(x, w, b), 1e-4, 1e-5);
      test::expect_tensor_near(apply_linear(x, w), at::linear(x, w), 1e-4, 1e-5);
      auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16), bb = b.to(at::kBFloat16);
      auto ref = at::linear(xb.to(at::kFloat), wb.to(at::kFloat), bb.to(at::kFloat));
      auto got = apply_linear(xb, wb, bb);
      ASSERT_EQ(got.scalar_type(), at::kBFloat16);
      test::expect_tensor_near(got.to(at::kFloat), ref, 0.05, 0.02);
    }
  }
}

TEST(LinearTest, KeepsTheAutogradGraphWhenWeightsRequireGrad) {
  auto x = at::randn({2, 16});
  auto w = at::randn({8, 16}).requires_grad_(true);
  auto y = apply_linear(x, w);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  test::expect_tensor_near(w.grad(), x.sum(0).expand({8, 16}), 1e-5);
}

}  // namespace
}  // namespace crl::engine

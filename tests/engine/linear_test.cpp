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

// The GEMV walks weight rows four at a time where it can and one at a time at a chunk's end: a
// row's output must not depend on which, so each row alone (a one-row weight) gives the same bits.
TEST(LinearTest, GemvGivesEachWeightRowTheSameBitsWhereverItFallsInTheBlocking) {
  at::manual_seed(2);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t rows : {1, 2, 3}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{203, 77}, {130, 576}}) {
        auto x = at::randn({rows, k}).to(dtype);
        auto w = at::randn({n, k}).to(dtype);
        auto b = at::randn({n}).to(dtype);
        at::Tensor all = apply_linear(x, w, b);
        for (int64_t j = 0; j < n; ++j) {
          at::Tensor one =
              apply_linear(x, w.narrow(0, j, 1).contiguous(), b.narrow(0, j, 1).contiguous());
          ASSERT_TRUE(at::equal(all.narrow(1, j, 1), one))
              << "weight row " << j << " of " << n << ", " << rows << " rows, " << dtype;
        }
      }
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

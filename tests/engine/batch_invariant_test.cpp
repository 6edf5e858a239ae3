// The batch-invariant kernels of deterministic mode (engine/kernels): every instruction-set path
// gives the scalar reference's bits, a row's output does not depend on the batch around it or on
// the thread count, the values match libtorch's within rounding, and the autograd wrappers train.
#include "engine/kernels/batch_invariant.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/kernels/cpu_isa.h"
#include "engine/model/deterministic_ops.h"
#include "tests/test_utils.h"

namespace crl::engine::kernels {
namespace {

struct Shape {
  int64_t m, n, k;
};

// Odd sizes on purpose: column tails of every panel width, depths past one packed block (384).
const std::vector<Shape> kShapes = {{1, 1, 1},    {3, 37, 19},    {13, 100, 385},
                                    {12, 32, 16}, {50, 576, 576}, {130, 33, 800}};

std::string label(at::ScalarType dt, const Shape& s) {
  return std::string(dt == at::kFloat ? "f32" : "bf16") + " m=" + std::to_string(s.m) +
         " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

TEST(BatchInvariantTest, EveryKernelPathGivesTheScalarReferenceBits) {
  ASSERT_GE(supported_cpu_isas().size(), 1u);
  at::manual_seed(11);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (const Shape& s : kShapes) {
      const auto x = at::randn({s.m, s.k}).to(dt);
      const auto w = at::randn({s.n, s.k}).to(dt);
      const auto b = at::randn({s.n}).to(dt);
      const auto g = (at::randn({s.m, s.n}) * 6).to(dt);
      at::Tensor lin, lin_nobias, norm, gate;
      {
        ScopedCpuIsa scalar(CpuIsa::kScalar);
        lin = bi_linear(x, w, b);
        lin_nobias = bi_linear(x, w);
        norm = bi_rms_norm(x, w[0], 1e-6);
        gate = bi_silu_mul(g, g.flip(1));
      }
      for (CpuIsa isa : supported_cpu_isas()) {
        SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " " + label(dt, s));
        ScopedCpuIsa path(isa);
        test::expect_tensor_equal(bi_linear(x, w, b), lin);
        test::expect_tensor_equal(bi_linear(x, w), lin_nobias);
        test::expect_tensor_equal(bi_rms_norm(x, w[0], 1e-6), norm);
        test::expect_tensor_equal(bi_silu_mul(g, g.flip(1)), gate);
      }
    }
  }
}

TEST(BatchInvariantTest, ASecondDepthSegmentIsTheLinearOfTheConcatenations) {
  // bi_linear(x, w, b, x2, w2) (an unmerged LoRA delta inside the base product) must give the bits
  // of one linear over [x | x2] and [w | w2] on every path: depths of the second segment below,
  // at and past one packed block, rows on both sides of a micro-tile, a row stride that is not k2.
  at::manual_seed(12);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (const Shape& s : kShapes) {
      for (int64_t k2 : {1, 32, 400}) {
        const auto x = at::randn({s.m, s.k}).to(dt);
        const auto w = at::randn({s.n, s.k}).to(dt);
        const auto b = at::randn({s.n}).to(dt);
        const auto x2 = at::randn({s.m, k2 + 3}).narrow(1, 2, k2);  // strided rows: made contiguous
        const auto w2 = at::randn({s.n, k2}).to(dt);
        at::Tensor want;
        {
          ScopedCpuIsa scalar(CpuIsa::kScalar);
          want = bi_linear(x, w, b, x2, w2);  // float32 x2 also beside bfloat16 weights
          if (dt == at::kFloat)
            test::expect_tensor_equal(want, bi_linear(at::cat({x, x2}, 1), at::cat({w, w2}, 1), b));
        }
        for (CpuIsa isa : supported_cpu_isas()) {
          SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " " + label(dt, s) +
                       " k2=" + std::to_string(k2));
          ScopedCpuIsa path(isa);
          test::expect_tensor_equal(bi_linear(x, w, b, x2, w2), want);
          // bfloat16 x2 as the model's own activations would be: the same widening.
          test::expect_tensor_equal(bi_linear(x, w, b, x2.to(dt), w2),
                                    bi_linear(at::cat({x, x2.to(dt)}, 1), at::cat({w, w2}, 1), b));
        }
      }
    }
  }
  // An empty first segment: the second alone (x2 widened as ever), in x's dtype.
  const auto x2 = at::randn({3, 5}).to(at::kBFloat16);
  const auto w2 = at::randn({4, 5});
  test::expect_tensor_equal(bi_linear(at::empty({3, 0}), at::empty({4, 0}), {}, x2, w2),
                            bi_linear(x2.to(at::kFloat), w2));
  ASSERT_THROWS_WITH(
      bi_linear(at::randn({2, 4}), at::randn({3, 4}), {}, at::randn({2, 5}), at::randn({3, 4})),
      std::logic_error, "second segment x2 [2, 5] and weight2 [3, 4] do not fit");
  ASSERT_THROWS_WITH(bi_linear(at::randn({2, 4}), at::randn({3, 4}), {}, at::randn({2, 4}),
                               at::randn({3, 4}).to(at::kBFloat16)),
                     std::logic_error, "weight2 is BFloat16, weight Float");
}

TEST(BatchInvariantTest, RowGroupsEachGetTheBitsOfTheirOwnWeights) {
  // Rows of several LoRA adapters in one call: bi_grouped_linear (each group's x A_g^T) and the
  // grouped second segment ([x | x2] [w | B_g]^T) give every row the bits of bi_linear of that row
  // alone with its own group's weights, on every path and thread count; rows of a group without a
  // weight get zeros and the base product. Groups of one row, of a micro-tile and more, empty
  // ones, a weightless one between others; depths below and past one packed block (both
  // segments); more rows than one task takes (320: row blocks of 160, one starting inside a group).
  struct Case {
    int64_t k, n, r;
    std::vector<std::pair<int64_t, bool>> sizes;  // (rows, has weights) per group
  };
  const std::vector<Case> cases = {
      {77, 40, 19, {{1, true}, {0, true}, {14, true}, {5, false}, {30, true}, {3, true}}},
      {800, 70, 400, {{200, true}, {90, true}, {10, false}, {20, true}}}};
  at::manual_seed(13);
  const int threads = at::get_num_threads();
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (const Case& c : cases) {
      int64_t m = 0;
      for (const auto& s : c.sizes) m += s.first;
      const auto x = at::randn({m, c.k}).to(dt);
      const auto w = at::randn({c.n, c.k}).to(dt);
      const auto b = at::randn({c.n}).to(dt);
      const auto x2 = at::randn({m, c.r});
      std::vector<RowGroup> down, up;
      int64_t row = 0;
      for (const auto& [size, on] : c.sizes) {
        down.push_back({row, row + size, on ? at::randn({c.r, c.k}).to(dt) : at::Tensor()});
        up.push_back({row, row + size, on ? at::randn({c.n, c.r}).to(dt) : at::Tensor()});
        row += size;
      }
      std::vector<at::Tensor> want_down, want_up;
      {
        ScopedCpuIsa scalar(CpuIsa::kScalar);
        for (size_t gi = 0; gi < down.size(); ++gi) {
          for (int64_t i = down[gi].begin; i < down[gi].end; ++i) {
            const auto xi = x.narrow(0, i, 1);
            want_down.push_back(down[gi].weight.defined() ? bi_linear(xi, down[gi].weight)
                                                          : at::zeros({1, c.r}, x.options()));
            want_up.push_back(up[gi].weight.defined()
                                  ? bi_linear(xi, w, b, x2.narrow(0, i, 1), up[gi].weight)
                                  : bi_linear(xi, w, b));
          }
        }
      }
      for (CpuIsa isa : supported_cpu_isas()) {
        for (int t : {1, threads}) {
          SCOPED_TRACE(std::string(cpu_isa_name(isa)) + (dt == at::kFloat ? " f32" : " bf16") +
                       " k=" + std::to_string(c.k) + " threads=" + std::to_string(t));
          ScopedCpuIsa path(isa);
          at::set_num_threads(t);
          test::expect_tensor_equal(bi_grouped_linear(x, down, c.r), at::cat(want_down));
          test::expect_tensor_equal(bi_linear(x, w, b, x2, up), at::cat(want_up));
          at::set_num_threads(threads);
        }
      }
    }
  }
  const auto x = at::randn({4, 3});
  ASSERT_THROWS_WITH(bi_grouped_linear(x, {{0, 2, at::randn({5, 3})}, {3, 4, {}}}, 5),
                     std::logic_error, "a group [3, 4) follows row 2");
  ASSERT_THROWS_WITH(bi_grouped_linear(x, {{0, 3, at::randn({5, 3})}}, 5), std::logic_error,
                     "row groups cover 3 of 4 rows");
  ASSERT_THROWS_WITH(bi_grouped_linear(x, {{0, 4, at::randn({5, 2})}}, 5), std::logic_error,
                     "the weight of rows [0, 4) is [5, 2]");
  ASSERT_THROWS_WITH(
      bi_linear(x, at::randn({6, 3}), {}, at::randn({4, 2}), {{0, 4, at::randn({6, 3})}}),
      std::logic_error, "second-segment weight of rows [0, 4) is [6, 3]");
}

TEST(BatchInvariantTest, ValuesMatchLibtorchWithinRounding) {
  at::manual_seed(12);
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa path(isa);
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " " + label(at::kFloat, s));
      const auto x = at::randn({s.m, s.k});
      const auto w = at::randn({s.n, s.k});
      const auto b = at::randn({s.n});
      const double tol = 1e-5 * std::sqrt(static_cast<double>(s.k)) * 4;
      test::expect_tensor_near(bi_linear(x, w, b), at::linear(x, w, b), tol, 1e-5);
      const auto nw = at::rand({s.k}) + 0.5;
      test::expect_tensor_near(bi_rms_norm(x, nw, 1e-6), aten_rms_norm(x, nw, 1e-6), 1e-5, 1e-5);
      const auto g = at::randn({s.m, s.k}) * 8;
      test::expect_tensor_near(bi_silu_mul(g, x), at::silu(g) * x, 1e-5, 1e-5);
      // bfloat16: within one bf16 rounding of the float32 result.
      const auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16), bb = b.to(at::kBFloat16);
      const auto ref = at::linear(xb.to(at::kFloat), wb.to(at::kFloat), bb.to(at::kFloat));
      const auto got = bi_linear(xb, wb, bb);
      ASSERT_EQ(got.scalar_type(), at::kBFloat16);
      test::expect_tensor_near(got.to(at::kFloat), ref, tol, 1.0 / 128);
    }
  }
}

// A row's output must not depend on how many rows are computed with it, where it sits, what its
// neighbours hold, or how many threads run: the property deterministic mode is built on.
TEST(BatchInvariantTest, ARowsOutputIgnoresBatchSizePositionNeighboursAndThreads) {
  at::manual_seed(13);
  const int64_t threads = at::get_num_threads();
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa path(isa);
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      // Model sizes on the vector paths; the slow scalar reference (whose bits the first test
      // shows every path reproduces) gets the small shape only.
      std::vector<std::pair<int64_t, int64_t>> shapes = {{130, 897}};
      if (isa != CpuIsa::kScalar) shapes.insert(shapes.end(), {{1536, 576}, {576, 1536}});
      for (auto [n, k] : shapes) {
        SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k));
        const auto w = at::randn({n, k}).to(dt);
        const auto b = at::randn({n}).to(dt);
        const auto nw = (at::rand({k}) + 0.5).to(dt);
        const auto row = at::randn({1, k}).to(dt);
        const auto lin_alone = bi_linear(row, w, b);
        const auto norm_alone = bi_rms_norm(row, nw, 1e-5);
        const auto gate_alone = bi_silu_mul(row, row * 2);
        for (auto [rows, pos] : {std::pair<int64_t, int64_t>{2, 1},
                                 {7, 3},
                                 {13, 12},
                                 {64, 40},
                                 {131, 130},
                                 {300, 250}}) {
          auto x = at::randn({rows, k}).to(dt);
          x.narrow(0, pos, 1).copy_(row);
          for (int64_t t : {int64_t{1}, threads}) {
            at::set_num_threads(static_cast<int>(t));
            test::expect_tensor_equal(bi_linear(x, w, b).narrow(0, pos, 1), lin_alone);
            test::expect_tensor_equal(bi_rms_norm(x, nw, 1e-5).narrow(0, pos, 1), norm_alone);
            test::expect_tensor_equal(bi_silu_mul(x, x * 2).narrow(0, pos, 1), gate_alone);
          }
          at::set_num_threads(static_cast<int>(threads));
        }
      }
    }
  }
}

TEST(BatchInvariantTest, AutogradWrappersKeepTheKernelValuesAndLibtorchGradients) {
  at::manual_seed(14);
  auto x = at::randn({9, 40}).requires_grad_(true);
  auto w = at::randn({24, 40}).requires_grad_(true);
  auto b = at::randn({24}).requires_grad_(true);
  auto nw = (at::rand({24}) + 0.5).requires_grad_(true);
  auto y = det_silu_mul(det_rms_norm(det_linear(x, w, b), nw, 1e-6), det_linear(x, w, b));
  {
    at::NoGradGuard no_grad;
    auto lin = bi_linear(x, w, b);
    test::expect_tensor_equal(y.detach(), bi_silu_mul(bi_rms_norm(lin, nw, 1e-6), lin));
  }
  y.pow(2).sum().backward();
  std::vector<at::Tensor> det_grads = {x.grad().clone(), w.grad().clone(), b.grad().clone(),
                                       nw.grad().clone()};
  for (auto* t : {&x, &w, &b, &nw}) t->mutable_grad().reset();
  auto lin = at::linear(x, w, b);
  auto ref = at::silu(aten_rms_norm(lin, nw, 1e-6)) * lin;
  ref.pow(2).sum().backward();
  const std::vector<at::Tensor> ref_grads = {x.grad(), w.grad(), b.grad(), nw.grad()};
  for (size_t i = 0; i < ref_grads.size(); ++i) {
    SCOPED_TRACE("gradient " + std::to_string(i));
    test::expect_tensor_near(det_grads[i], ref_grads[i], 1e-3, 1e-3);
  }
}

// The trainer's default CPU linear: the kernel forward and backward. Values are bi_linear's; the
// three gradients match at::linear's backward within float32 rounding.
TEST(BatchInvariantTest, KernelLinearTrainsLikeAtLinear) {
  at::manual_seed(15);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    auto x = at::randn({37, 70}).requires_grad_(true);
    auto w = at::randn({45, 70}).requires_grad_(true);
    auto b = with_bias ? at::randn({45}).requires_grad_(true) : at::Tensor();
    const auto gy = at::randn({37, 45});
    auto y = kernel_linear(x, w, b);
    {
      at::NoGradGuard no_grad;
      test::expect_tensor_equal(y.detach(), bi_linear(x, w, b));
    }
    y.backward(gy);
    std::vector<at::Tensor> got = {x.grad().clone(), w.grad().clone()};
    if (with_bias) got.push_back(b.grad().clone());
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    if (with_bias) b.mutable_grad().reset();
    at::linear(x, w, b).backward(gy);
    std::vector<at::Tensor> ref = {x.grad(), w.grad()};
    if (with_bias) ref.push_back(b.grad());
    for (size_t i = 0; i < ref.size(); ++i) {
      SCOPED_TRACE("gradient " + std::to_string(i));
      test::expect_tensor_near(got[i], ref[i], 1e-4, 1e-4);
    }
    // Only what needs a gradient gets one.
    auto frozen = at::randn({45, 70});
    auto x2 = at::randn({3, 70}).requires_grad_(true);
    kernel_linear(x2, frozen, {}).sum().backward();
    test::expect_tensor_near(x2.grad(), frozen.sum(0).expand({3, 70}), 1e-4, 1e-4);
  }
}

TEST(BatchInvariantTest, BadInputsAreClearErrors) {
  ASSERT_THROWS_WITH(bi_linear(at::randn({2, 3}), at::randn({4, 5})), std::exception,
                     "do not match");
  ASSERT_THROWS_WITH(bi_linear(at::randn({2, 3}), at::randn({4, 3}).to(at::kBFloat16)),
                     std::exception, "weight BFloat16");
  ASSERT_THROWS_WITH(bi_linear(at::randn({2, 3}).to(at::kDouble), at::randn({4, 3})),
                     std::exception, "float32 or bfloat16");
  ASSERT_THROWS_WITH(parse_cpu_isa("sse9"), std::invalid_argument,
                     "unknown CPU kernel path 'sse9'");
  EXPECT_EQ(parse_cpu_isa("avx2"), CpuIsa::kAvx2);
  EXPECT_NE(describe_cpu().find("kernels: "), std::string::npos);
}

// The AVX512-BF16 linear (vdpbf16ps) of the default mode. Its reference is the canonical chain:
// bfloat16 products are exact in float32, so with normal inputs it must give bi_linear's bits.
// Only CPUs with AVX512-BF16 can run it; elsewhere these tests skip and say so.
class Bf16DotLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 here: " << describe_cpu();
  }
};

TEST_F(Bf16DotLinearTest, GivesTheCanonicalChainsBitsForNormalInputs) {
  at::manual_seed(21);
  // Odd depths (the last pair half empty), depths past one packed block (384 pairs), column tails,
  // row counts that split into unequal tiles and row blocks (the kernel takes up to 256 rows a
  // task).
  const std::vector<Shape> shapes = {{1, 1, 1},     {3, 37, 19},    {13, 100, 385},
                                     {12, 32, 16},  {64, 576, 576}, {130, 33, 801},
                                     {257, 70, 64}, {5, 300, 1536}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(label(at::kBFloat16, s));
    const auto x = at::randn({s.m, s.k}).to(at::kBFloat16);
    const auto w = (at::randn({s.n, s.k}) * 0.05).to(at::kBFloat16);
    const auto b = at::randn({s.n}).to(at::kBFloat16);
    const auto got = bf16_dot_linear(x, w, b);
    ASSERT_EQ(got.scalar_type(), at::kBFloat16);
    test::expect_tensor_equal(got, bi_linear(x, w, b));
    test::expect_tensor_equal(bf16_dot_linear(x, w), bi_linear(x, w));
    // A strided x (a view into a wider tensor) reads the same values.
    const auto wide = at::randn({s.m, s.k + 3}).to(at::kBFloat16);
    wide.narrow(1, 1, s.k).copy_(x);
    test::expect_tensor_equal(bf16_dot_linear(wide.narrow(1, 1, s.k), w, b), got);
  }
}

TEST_F(Bf16DotLinearTest, MatchesFloat32WithinBf16RoundingAndIgnoresTheBatch) {
  at::manual_seed(22);
  const auto x = at::randn({64, 576});
  const auto w = at::randn({1536, 576}) * 0.04;
  const auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
  // Against float32 on the float32 inputs: bf16 rounding of the inputs and of the output.
  const auto ref = at::linear(x, w);
  test::expect_tensor_near(bf16_dot_linear(xb, wb).to(at::kFloat), ref, 0.05, 1.0 / 64);
  // A row gives the same bits alone, in any batch, at any thread count.
  const auto alone = bf16_dot_linear(xb.narrow(0, 40, 1), wb);
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    test::expect_tensor_equal(bf16_dot_linear(xb, wb).narrow(0, 40, 1), alone);
    test::expect_tensor_equal(bf16_dot_linear(xb.narrow(0, 37, 5), wb).narrow(0, 3, 1), alone);
  }
}

TEST_F(Bf16DotLinearTest, DenormalInputsReadAsZeroAsTheInstructionDefines) {
  // 2^-130 is a bfloat16 denormal; times 2^100 the canonical chain gives 2^-30, vdpbf16ps zero.
  const auto x = at::full({1, 2}, std::ldexp(1.0, -130)).to(at::kBFloat16);
  const auto w = at::full({1, 2}, std::ldexp(1.0, 100)).to(at::kBFloat16);
  EXPECT_EQ(bi_linear(x, w).item<float>(), static_cast<float>(std::ldexp(1.0, -29)));
  EXPECT_EQ(bf16_dot_linear(x, w).item<float>(), 0.0f);
}

TEST(Bf16DotLinearErrors, WrongDtypeOrPathIsAClearError) {
  ASSERT_THROWS_WITH(bf16_dot_linear(at::randn({2, 3}), at::randn({4, 3})), std::exception,
                     "must be bfloat16");
  if (supported_cpu_isas().size() > 1) {
    ScopedCpuIsa avx2(CpuIsa::kAvx2);
    EXPECT_FALSE(bf16_dot_supported());
    ASSERT_THROWS_WITH(
        bf16_dot_linear(at::randn({2, 3}).to(at::kBFloat16), at::randn({4, 3}).to(at::kBFloat16)),
        std::exception, "needs AVX512-BF16 and the AVX-512 kernel path");
  }
}

// OpenBLAS's choice is raised only from its cores without AVX2 kernels, to the project's path
// (SkylakeX for AVX-512, Haswell for AVX2); a choice with AVX2 kernels (Haswell, Zen, SkylakeX,
// ...) or an unknown name stays, in any letter case; the scalar path asks for nothing.
TEST(CpuIsaTest, OpenBlasKernelsAreRaisedOnlyFromBelowAvx2) {
  EXPECT_EQ(openblas_core_for("Prescott", CpuIsa::kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_for("Prescott", CpuIsa::kAvx2), "Haswell");
  EXPECT_EQ(openblas_core_for("Nehalem", CpuIsa::kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_for("Sandybridge", CpuIsa::kAvx2), "Haswell");
  for (const char* kept : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "zen"}) {
    EXPECT_EQ(openblas_core_for(kept, CpuIsa::kAvx512), "") << kept;
    EXPECT_EQ(openblas_core_for(kept, CpuIsa::kAvx2), "") << kept;
  }
  EXPECT_EQ(openblas_core_for("Prescott", CpuIsa::kScalar), "");
  EXPECT_EQ(openblas_core_for("GraniteRapids", CpuIsa::kAvx512), "");  // newer than the list
  EXPECT_EQ(openblas_core_for("", CpuIsa::kAvx512), "");
}

}  // namespace
}  // namespace crl::engine::kernels

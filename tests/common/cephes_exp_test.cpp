#include "common/cephes_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace crl {
namespace {

typedef float v8f __attribute__((vector_size(32)));

// Distance in units in the last place between two positive normal floats.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(int64_t{ia} - int64_t{ib});
}

// Every float of [kExpMinArg, kExpMaxArg] at a stride that visits every exponent many times.
template <class Fn>
void for_each_argument(Fn&& fn) {
  uint32_t lo_bits, hi_bits;
  const float lo = kExpMinArg, hi = kExpMaxArg;
  std::memcpy(&lo_bits, &lo, 4);  // negative: bits grow toward -inf
  std::memcpy(&hi_bits, &hi, 4);
  for (uint32_t b = 0x80000000u; b <= lo_bits; b += 997) {
    float x;
    std::memcpy(&x, &b, 4);
    fn(x);
  }
  for (uint32_t b = 0; b <= hi_bits; b += 997) {
    float x;
    std::memcpy(&x, &b, 4);
    fn(x);
  }
  fn(lo);
  fn(hi);
}

TEST(CephesExpTest, WithinTwoUlpsOfExpOverTheWholeArgumentRange) {
  int64_t worst = 0, count = 0;
  for_each_argument([&](float x) {
    float e = x;
    exp_cephes(e);
    const float ref = static_cast<float>(std::exp(static_cast<double>(x)));
    ASSERT_TRUE(std::isnormal(e)) << x;
    worst = std::max(worst, ulps(e, ref));
    ++count;
  });
  EXPECT_GT(count, 2000000);
  EXPECT_LE(worst, 2);
}

TEST(CephesExpTest, VectorLanesGiveTheScalarBits) {
  // The sampler runs it on 8-float vectors, the attention and SiLU kernels on scalars: one
  // polynomial, the same bits (the kernels' cross-ISA bit identity rests on it).
  v8f v{};
  float xs[8];
  int lane = 0;
  int64_t mismatches = 0;
  for_each_argument([&](float x) {
    xs[lane] = x;
    v[lane] = x;
    if (++lane < 8) return;
    lane = 0;
    exp_cephes(v);
    for (int i = 0; i < 8; ++i) {
      float s = xs[i];
      exp_cephes(s);
      mismatches += std::memcmp(&s, &v[i], 4) != 0;
    }
  });
  EXPECT_EQ(mismatches, 0);
}

TEST(CephesExpTest, ExactWhereExpIsExact) {
  float z = 0.0f;
  exp_cephes(z);
  EXPECT_EQ(z, 1.0f);
}

}  // namespace
}  // namespace crl

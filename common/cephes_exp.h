// The one exp of the CPU kernels: the Cephes expf polynomial (about 1 ulp) after a
// round-to-nearest ln2 range reduction. The batch-invariant SiLU (engine/kernels), the sampler's
// softmax (engine/kernels) and the paged attention's online softmax (kv/) all compute exp with it,
// each after its own clamps: the kernels differ in the range they accept, not in the polynomial.
//
// F is float or a GCC vector of float. Only IEEE operations in a fixed order, so a unit built
// with -ffp-contract=off (or for an ISA without FMA) computes the same bits on every ISA.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace crl {
// Unnamed: each translation unit gets its own copy, compiled for its own instruction set (the
// kernel units are built for different ISAs; one shared inline definition would let the linker
// hand an AVX-512 body to the baseline unit).
namespace {

// The argument range of exp_cephes: below kExpMinArg exp is not a normal float (callers clamp and
// give 0 there); above kExpMaxArg it overflows soon after (callers clamp and give +inf).
constexpr float kExpMinArg = -87.33654f;
constexpr float kExpMaxArg = 88.0f;

// x = exp(x) for x in [kExpMinArg, kExpMaxArg]. In place, because a 32-byte vector passed by value
// has a different ABI in AVX2 and baseline target clones.
template <class F>
inline void exp_cephes(F& x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const F n = (x * kLog2e + kRound) - kRound;
  F r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // Scale by 2^n (n in [-126, 127], p in [0.7, 1.5), so the result stays normal): add n to the
  // exponent bits.
  if constexpr (std::is_same_v<F, float>) {
    int32_t bits;
    std::memcpy(&bits, &p, sizeof(bits));
    bits += static_cast<int32_t>(n) * (1 << 23);
    std::memcpy(&x, &bits, sizeof(bits));
  } else {
    using I = decltype(n < n);  // the integer vector of F's width
    x = (F)((I)p + (__builtin_convertvector(n, I) << 23));
  }
}

}  // namespace
}  // namespace crl

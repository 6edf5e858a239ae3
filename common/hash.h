// Small hashes with no state, the same on every platform.
#pragma once

#include <cstdint>

namespace crl {

// SplitMix64's step (add the golden ratio, then its finalizer): a bijective 64-bit mixer, so
// distinct inputs chained through it stay distinct.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace crl

// AVX2 batch-invariant kernels (AVX2 + FMA, no AVX-512), built with -mavx2 -mfma -mno-avx512f
// and -ffp-contract=off (engine/CMakeLists.txt); chosen at run time by engine/kernels/cpu_isa.
//
// GEMM as in bi_kernels_avx512.cpp with kNr = 16 columns per panel (two 8-lane vectors), 8 x 8
// in-register transposes for packing and micro-tiles of up to kMr = 6 rows (12 accumulators).
// Every output is still the canonical chain of bi_kernels.h: one FMA per depth, ascending.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/cephes_exp.h"
#include "engine/kernels/bi_kernels.h"

namespace crl::engine::kernels::detail {
namespace {

#include "engine/kernels/bi_gemm_impl.h"
#include "engine/kernels/bi_rowwise_impl.h"

constexpr int64_t kNr = 16;
constexpr int64_t kMr = 6;
constexpr int64_t kKc = 384;

// Up to 8 consecutive weights of row `row` from depth k0, widened to float (zeros past count).
inline __m256 load_w(const GemmArgs& a, int64_t row, int64_t k0, int64_t count) {
  if (a.w_bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(a.w) + row * a.k + k0;
    __m128i h;
    if (count >= 8) {
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      uint16_t tmp[8] = {};
      std::memcpy(tmp, p, count * sizeof(uint16_t));
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tmp));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  const float* p = static_cast<const float*>(a.w) + row * a.k + k0;
  if (count >= 8) return _mm256_loadu_ps(p);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
  return _mm256_maskload_ps(p, mask);
}

// In-place transpose of an 8 x 8 float block held as 8 row vectors.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int b = 0; b < 8; b += 4) {  // s[b + c], 128-bit lane L: column 4L + c of rows b .. b + 3
    s[b + 0] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[b + 1] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
  }
}

// pw[kk * kNr + j] = w[n0 + j, kb + kk] for kk < kc, j < kNr (zero for columns past `cols`).
void pack_panel(const GemmArgs& a, int64_t n0, int64_t cols, int64_t kb, int64_t kc, float* pw) {
  for (int64_t k0 = 0; k0 < kc; k0 += 8) {
    const int64_t kcnt = kc - k0 < 8 ? kc - k0 : 8;
    for (int64_t part = 0; part < kNr / 8; ++part) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) {
        const int64_t col = part * 8 + j;
        if (col < cols) {
          r[j] = load_w(a, n0 + col, kb + k0, kcnt);
          prefetch_next_panel<kNr>(a, n0 + col, kb + k0);
        } else {
          r[j] = _mm256_setzero_ps();
        }
      }
      transpose8(r);
      float* dst = pw + k0 * kNr + part * 8;
      if (kcnt == 8) {
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * kNr, r[i]);
      } else {
        for (int i = 0; i < kcnt; ++i) _mm256_storeu_ps(dst + i * kNr, r[i]);
      }
    }
  }
}

// Round to nearest even bfloat16 (as float_to_bf16), 8 lanes.
inline __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r),
                                           _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)), nan));
  const __m256i packed = _mm256_packus_epi32(r, r);  // values fit in 16 bits: no saturation
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

inline void store8(const GemmArgs& a, int64_t row, int64_t n0, __m256 v) {
  if (a.bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(a.bias + n0));
  if (a.y_bf16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(a.y) + row * a.ldy + n0),
                     to_bf16(v));
  } else {
    _mm256_storeu_ps(static_cast<float*>(a.y) + row * a.ldy + n0, v);
  }
}

// One micro-tile: rows [row0, row0 + MR) x the panel's 16 columns over one depth block.
template <int MR>
void tile(const GemmArgs& a, const float* x, const float* pw, int64_t kc, float* acc, bool first,
          bool last, int64_t row0, int64_t n0, int64_t cols) {
  // The accumulators must stay in registers: every loop over them is unrolled (a run-time index
  // would keep them in memory), and the finished chains go through `acc` before the output.
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    c0[i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i * kNr);
    c1[i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i * kNr + 8);
  }
  const int64_t ldx = a.ldx;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 w0 = _mm256_loadu_ps(pw + kk * kNr);
    const __m256 w1 = _mm256_loadu_ps(pw + kk * kNr + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 b = _mm256_broadcast_ss(x + i * ldx + kk);
      c0[i] = _mm256_fmadd_ps(b, w0, c0[i]);
      c1[i] = _mm256_fmadd_ps(b, w1, c1[i]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(acc + i * kNr, c0[i]);
    _mm256_storeu_ps(acc + i * kNr + 8, c1[i]);
  }
  if (!last) return;
  for (int i = 0; i < MR; ++i) {
    const float* chains = acc + i * kNr;
    if (cols == kNr) {
      store8(a, row0 + i, n0, _mm256_loadu_ps(chains));
      store8(a, row0 + i, n0 + 8, _mm256_loadu_ps(chains + 8));
    } else {
      store_outputs(a, row0 + i, n0, cols, chains);
    }
  }
}

constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

void gemm(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch) {
  gemm_panels<kNr, kMr, kKc>(a, m0, m1, p0, p1, scratch, pack_panel, kTiles);
}

}  // namespace

const KernelTable kAvx2Kernels = {"avx2", kNr, kMr, kKc, gemm, rms_norm_rows, silu_mul};

}  // namespace crl::engine::kernels::detail

// AVX-512 batch-invariant kernels (AVX512F/BW/VL + FMA), built with those flags and
// -ffp-contract=off (engine/CMakeLists.txt); chosen at run time by engine/kernels/cpu_isa.
//
// GEMM: the weight matrix is walked in panels of kNr = 32 output columns and blocks of kKc depths.
// Each (panel, depth block) is packed, transposed 16 x 16 in registers, into pw[kk][32] so that
// one depth step is two vector loads; a micro-tile of up to kMr = 12 rows keeps 24 accumulators
// (one per row and 16 columns) and adds x[row, k] * w[n, k] with one FMA per k in ascending order,
// which is exactly the canonical chain of bi_kernels.h. Partial chains between depth blocks are
// kept in float32 scratch, so blocking changes no bit.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/cephes_exp.h"
#include "engine/kernels/bi_kernels.h"

namespace crl::engine::kernels::detail {
namespace {

#include "engine/kernels/avx512_impl.h"
#include "engine/kernels/bi_gemm_impl.h"
#include "engine/kernels/bi_rowwise_impl.h"

constexpr int64_t kNr = 32;
constexpr int64_t kMr = 12;
constexpr int64_t kKc = 384;

// Up to 16 consecutive weights of row `row` from depth k0, widened to float (zeros past count).
inline __m512 load_w(const GemmArgs& a, int64_t row, int64_t k0, int64_t count) {
  const __mmask16 m = first_n(count);
  if (a.w_bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(a.w) + row * a.k + k0;
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(a.w) + row * a.k + k0);
}

// pw[kk * kNr + j] = w[n0 + j, kb + kk] for kk < kc, j < kNr (zero for columns past `cols`).
void pack_panel(const GemmArgs& a, int64_t n0, int64_t cols, int64_t kb, int64_t kc, float* pw) {
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    const int64_t kcnt = kc - k0 < 16 ? kc - k0 : 16;
    for (int64_t half = 0; half < kNr / 16; ++half) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t col = half * 16 + j;
        if (col < cols) {
          r[j] = load_w(a, n0 + col, kb + k0, kcnt);
          prefetch_next_panel<kNr>(a, n0 + col, kb + k0);
        } else {
          r[j] = _mm512_setzero_ps();
        }
      }
      transpose16(r);
      float* dst = pw + k0 * kNr + half * 16;
      if (kcnt == 16) {
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * kNr, r[i]);
      } else {
        for (int i = 0; i < kcnt; ++i) _mm512_storeu_ps(dst + i * kNr, r[i]);
      }
    }
  }
}

// One micro-tile: rows [row0, row0 + MR) x the panel's 32 columns over one depth block.
// x points at (row0, kb); acc at the tile's float32 partial chains ([MR][kNr]).
template <int MR>
void tile(const GemmArgs& a, const float* x, const float* pw, int64_t kc, float* acc, bool first,
          bool last, int64_t row0, int64_t n0, int64_t cols) {
  // The accumulators must stay in registers: every loop over them is unrolled (a run-time index
  // would keep them in memory), and the finished chains go through `acc` before the output.
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * kNr);
    c1[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * kNr + 16);
  }
  const int64_t ldx = a.ldx;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 w0 = _mm512_loadu_ps(pw + kk * kNr);
    const __m512 w1 = _mm512_loadu_ps(pw + kk * kNr + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(x[i * ldx + kk]);
      c0[i] = _mm512_fmadd_ps(b, w0, c0[i]);
      c1[i] = _mm512_fmadd_ps(b, w1, c1[i]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_storeu_ps(acc + i * kNr, c0[i]);
    _mm512_storeu_ps(acc + i * kNr + 16, c1[i]);
  }
  if (!last) return;
  for (int i = 0; i < MR; ++i) {
    const float* chains = acc + i * kNr;
    if (cols == kNr) {
      store16(a, row0 + i, n0, _mm512_loadu_ps(chains));
      store16(a, row0 + i, n0 + 16, _mm512_loadu_ps(chains + 16));
    } else {
      store_outputs(a, row0 + i, n0, cols, chains);
    }
  }
}

constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>,  tile<4>,  tile<5>, tile<6>,
                                    tile<7>, tile<8>, tile<9>, tile<10>, tile<11>, tile<12>};

void gemm(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch) {
  gemm_panels<kNr, kMr, kKc>(a, m0, m1, p0, p1, scratch, pack_panel, kTiles);
}

}  // namespace

const KernelTable kAvx512Kernels = {"avx512", kNr, kMr, kKc, gemm, rms_norm_rows, silu_mul};

}  // namespace crl::engine::kernels::detail

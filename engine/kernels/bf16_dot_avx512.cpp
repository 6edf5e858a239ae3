// The AVX512-BF16 linear: bfloat16 x and w, float32 chains by vdpbf16ps (bi_kernels.h,
// DotKernel). Built with AVX-512 + AVX512-BF16 flags and -ffp-contract=off (engine/CMakeLists.txt);
// run only where the CPU has AVX512-BF16 (kernels::bf16_dot_supported).
//
// Same blocking as the float32 AVX-512 GEMM: panels of kNr = 32 output columns, blocks of kKcp
// depth pairs packed as pw[pair][32] (each entry a dword of two bfloat16 weights, depth 2j in the
// high half), micro-tiles of up to kMr = 12 rows with 24 accumulators. One vdpbf16ps per row and
// 16 columns consumes two depths, so a depth step costs half the instructions of the float32
// kernel and the packed panel half the bytes.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/cephes_exp.h"
#include "engine/kernels/bi_kernels.h"

namespace crl::engine::kernels::detail {
namespace {

#include "engine/kernels/avx512_impl.h"
#include "engine/kernels/bi_rowwise_impl.h"

constexpr int64_t kNr = 32;
constexpr int64_t kMr = 12;
constexpr int64_t kKcp = 192;

// pw[j * kNr + c] = the weight pair (w[n0 + c, 2(pb + j)], w[n0 + c, 2(pb + j) + 1]) as a dword
// with the even depth high, for j < kcp and c < kNr (zero for columns past `cols` and depths past
// k).
void pack_panel(const GemmArgs& a, int64_t n0, int64_t cols, int64_t pb, int64_t kcp,
                uint32_t* pw) {
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  for (int64_t j0 = 0; j0 < kcp; j0 += 16) {
    const int64_t jcnt = kcp - j0 < 16 ? kcp - j0 : 16;
    const int64_t d0 = 2 * (pb + j0);  // first depth of this group of 16 pairs
    const int64_t dcnt = a.k - d0 < 2 * jcnt ? a.k - d0 : 2 * jcnt;
    const __mmask32 mask = dcnt >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                                      : static_cast<__mmask32>((1ull << dcnt) - 1ull);
    for (int64_t half = 0; half < kNr / 16; ++half) {
      __m512 r[16];
      for (int c = 0; c < 16; ++c) {
        const int64_t col = half * 16 + c;
        if (col < cols) {
          // 16 pairs of column `col`; rotating each dword by 16 puts the even depth high.
          const uint16_t* src = w + (n0 + col) * a.k + d0;
          const __m512i v = _mm512_maskz_loadu_epi16(mask, src);
          // The same bytes of the next panel's column, into L2: a panel reads 32 rows at once,
          // more streams than the hardware prefetcher follows (a large lm_head ran at half speed).
          if (n0 + col + kNr < a.n)
            _mm_prefetch(reinterpret_cast<const char*>(src + kNr * a.k), _MM_HINT_T1);
          r[c] = _mm512_castsi512_ps(_mm512_rol_epi32(v, 16));
        } else {
          r[c] = _mm512_setzero_ps();
        }
      }
      transpose16(r);  // data moves only: the dwords keep their bits
      uint32_t* dst = pw + j0 * kNr + half * 16;
      for (int i = 0; i < jcnt; ++i)
        _mm512_storeu_ps(reinterpret_cast<float*>(dst + i * kNr), r[i]);
    }
  }
}

// One micro-tile: rows [row0, row0 + MR) x the panel's 32 columns over one block of depth pairs.
// xp points at (row0, pair pb); acc at the tile's float32 partial chains ([MR][kNr]).
template <int MR>
void tile(const GemmArgs& a, const uint32_t* xp, const uint32_t* pw, int64_t kcp, float* acc,
          bool first, bool last, int64_t row0, int64_t n0, int64_t cols) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * kNr);
    c1[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * kNr + 16);
  }
  const int64_t ldxp = a.ldxp;
  for (int64_t j = 0; j < kcp; ++j) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(pw + j * kNr);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(pw + j * kNr + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[i * ldxp + j]));
      c0[i] = _mm512_dpbf16_ps(c0[i], b, w0);
      c1[i] = _mm512_dpbf16_ps(c1[i], b, w1);
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

using TileFn = void (*)(const GemmArgs&, const uint32_t*, const uint32_t*, int64_t, float*, bool,
                        bool, int64_t, int64_t, int64_t);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>,  tile<4>,  tile<5>, tile<6>,
                                    tile<7>, tile<8>, tile<9>, tile<10>, tile<11>, tile<12>};

// Panel by panel, each over the whole depth: a panel's partial chains stay in L1 between depth
// blocks. Row tiles are balanced (64 rows: 11+11+11+11+10+10, not 12 x 5 + 4), which keeps at least
// ~20 chains in flight per tile; neither choice changes a bit.
void gemm(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch) {
  uint32_t* pw = reinterpret_cast<uint32_t*>(scratch);  // [kKcp][kNr] packed panel block
  float* acc = scratch + kKcp * kNr;                    // [m1 - m0][kNr] partial chains
  const int64_t rows = m1 - m0;
  const int64_t tiles = (rows + kMr - 1) / kMr;
  const int64_t pairs = (a.k + 1) / 2;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNr;
    const int64_t cols = a.n - n0 < kNr ? a.n - n0 : kNr;
    for (int64_t pb = 0; pb < pairs; pb += kKcp) {
      const int64_t kcp = pairs - pb < kKcp ? pairs - pb : kKcp;
      const bool first = pb == 0;
      const bool last = pb + kcp == pairs;
      pack_panel(a, n0, cols, pb, kcp, pw);
      int64_t r = m0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t mr = (rows * (t + 1)) / tiles - (rows * t) / tiles;
        kTiles[mr](a, a.xp + r * a.ldxp + pb, pw, kcp, acc + (r - m0) * kNr, first, last, r, n0,
                   cols);
        r += mr;
      }
    }
  }
}

}  // namespace

const DotKernel kAvx512Bf16Dot = {"avx512_bf16", kNr, kMr, kKcp, gemm};

}  // namespace crl::engine::kernels::detail

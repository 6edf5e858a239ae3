// Internal to engine/kernels: the GEMM block loop the SIMD units (bi_kernels_{avx2,avx512}.cpp)
// share, included inside their anonymous namespace after <immintrin.h> and bi_kernels.h, so each
// unit compiles it for its own instruction set with its own panel width, tile height and depth
// block. The unit supplies the packing and the micro-tiles; the loop order below is what makes
// every output the canonical chain of bi_kernels.h (panels, then segments, then depth blocks in
// ascending order; partial chains kept in float32 scratch between blocks).

// The weights of column `col + Nr` (the next panel's) at depth k0, into L2: a panel reads Nr rows
// at once, more streams than the hardware prefetcher follows.
template <int64_t Nr>
inline void prefetch_next_panel(const GemmArgs& a, int64_t col, int64_t k0) {
  if (col + Nr >= a.n) return;
  const int64_t elem = a.w_bf16 ? 2 : 4;
  _mm_prefetch(static_cast<const char*>(a.w) + ((col + Nr) * a.k + k0) * elem, _MM_HINT_T1);
}

// pw[kk * Nr + j] = w[n0 + j, kb + kk] for kk < kc, j < Nr (zero for columns past `cols`).
using PackFn = void (*)(const GemmArgs& a, int64_t n0, int64_t cols, int64_t kb, int64_t kc,
                        float* pw);
// One micro-tile of MR rows (the table's index) x one panel over one depth block: x points at
// (row0, kb), acc at the tile's partial chains ([MR][Nr]); `first` starts the chains at zero,
// `last` writes the outputs.
using TileFn = void (*)(const GemmArgs&, const float*, const float*, int64_t, float*, bool, bool,
                        int64_t, int64_t, int64_t);

// Panel by panel, each over the whole depth (both segments): a panel's partial chains stay in L1
// between depth blocks. Row tiles are balanced (as many as Mr-row tiles would be, sizes differing
// by at most one), which keeps the most chains in flight; neither choice changes a bit.
template <int64_t Nr, int64_t Mr, int64_t Kc>
inline void gemm_panels(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                        float* scratch, PackFn pack, const TileFn* tiles_by_rows) {
  float* pw = scratch;              // [Kc][Nr] packed panel block
  float* acc = scratch + Kc * Nr;   // [m1 - m0][Nr] partial chains
  const int64_t rows = m1 - m0;
  const int64_t tiles = (rows + Mr - 1) / Mr;
  GemmArgs seg[2];
  const int segs = gemm_segments(a, seg);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * Nr;
    const int64_t cols = a.n - n0 < Nr ? a.n - n0 : Nr;
    for (int si = 0; si < segs; ++si) {
      const GemmArgs& s = seg[si];
      for (int64_t kb = 0; kb < s.k; kb += Kc) {
        const int64_t kc = s.k - kb < Kc ? s.k - kb : Kc;
        const bool first = si == 0 && kb == 0;
        const bool last = si == segs - 1 && kb + kc == s.k;
        pack(s, n0, cols, kb, kc, pw);
        int64_t r = m0;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t mr = (rows * (t + 1)) / tiles - (rows * t) / tiles;
          tiles_by_rows[mr](s, s.x + r * s.ldx + kb, pw, kc, acc + (r - m0) * Nr, first, last, r,
                            n0, cols);
          r += mr;
        }
      }
    }
  }
}

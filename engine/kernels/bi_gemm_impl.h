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

// Calls f(begin, end, w2) for each run of rows in [m0, m1) that shares one second-segment weight
// (w2 null: the rows have none): a's row groups (GemmArgs::groups2), or the whole range with w2.
template <typename F>
inline void for_each_row_span(const GemmArgs& a, int64_t m0, int64_t m1, F&& f) {
  if (a.num_groups2 == 0) {
    f(m0, m1, a.k2 > 0 ? a.w2 : nullptr);
    return;
  }
  int64_t begin = 0;
  for (int64_t g = 0; g < a.num_groups2 && begin < m1; ++g) {
    const int64_t end = a.groups2[g].end;
    const int64_t b = begin > m0 ? begin : m0, e = end < m1 ? end : m1;
    if (b < e) f(b, e, a.groups2[g].w2);
    begin = end;
  }
}

// Calls f(begin, end, has_second) for each run of rows in [m0, m1) whose chains all go on into a
// second segment or all end with the first: for_each_row_span's spans, merged by that alone.
template <typename F>
inline void for_each_finish_span(const GemmArgs& a, int64_t m0, int64_t m1, F&& f) {
  int64_t begin = m0;
  bool has = false, open = false;
  for_each_row_span(a, m0, m1, [&](int64_t b, int64_t /*end*/, const void* w2) {
    const bool h = w2 != nullptr;
    if (open && h != has) {
      f(begin, b, has);
      begin = b;
    }
    has = h;
    open = true;
  });
  if (open) f(begin, m1, has);
}

// Panel by panel, each over the whole depth (both segments): a panel's partial chains stay in L1
// between depth blocks. The first segment's block is packed once for all rows and its tiles span
// rows of different second-segment weights (split only where chains end with it); the second
// segment's block is packed once per row span that has one (one adapter's rows). Row tiles are
// balanced within a span (as many as Mr-row tiles would be, sizes differing by at most one), which
// keeps the most chains in flight; neither choice changes a bit.
template <int64_t Nr, int64_t Mr, int64_t Kc>
inline void gemm_panels(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                        float* scratch, PackFn pack, const TileFn* tiles_by_rows) {
  float* pw = scratch;             // [Kc][Nr] packed panel block
  float* acc = scratch + Kc * Nr;  // [m1 - m0][Nr] partial chains
  GemmArgs seg[2];
  const int segs = gemm_segments(a, seg);
  // The tiles of rows [r0, r1) over one packed block of segment s.
  auto tiles = [&](const GemmArgs& s, int64_t r0, int64_t r1, int64_t kb, int64_t kc, bool first,
                   bool last, int64_t n0, int64_t cols) {
    const int64_t rows = r1 - r0;
    const int64_t count = (rows + Mr - 1) / Mr;
    int64_t r = r0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t mr = (rows * (t + 1)) / count - (rows * t) / count;
      tiles_by_rows[mr](s, s.x + r * s.ldx + kb, pw, kc, acc + (r - m0) * Nr, first, last, r, n0,
                        cols);
      r += mr;
    }
  };
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * Nr;
    const int64_t cols = a.n - n0 < Nr ? a.n - n0 : Nr;
    const GemmArgs& s0 = seg[0];
    for (int64_t kb = 0; kb < s0.k; kb += Kc) {
      const int64_t kc = s0.k - kb < Kc ? s0.k - kb : Kc;
      const bool end0 = kb + kc == s0.k;
      pack(s0, n0, cols, kb, kc, pw);
      for_each_finish_span(a, m0, m1, [&](int64_t r0, int64_t r1, bool has_second) {
        tiles(s0, r0, r1, kb, kc, kb == 0, end0 && (segs == 1 || !has_second), n0, cols);
      });
    }
    if (segs == 1) continue;
    for_each_row_span(a, m0, m1, [&](int64_t r0, int64_t r1, const void* w2) {
      if (w2 == nullptr) return;
      GemmArgs s1 = seg[1];
      s1.w = w2;
      for (int64_t kb = 0; kb < s1.k; kb += Kc) {
        const int64_t kc = s1.k - kb < Kc ? s1.k - kb : Kc;
        pack(s1, n0, cols, kb, kc, pw);
        tiles(s1, r0, r1, kb, kc, false, kb + kc == s1.k, n0, cols);
      }
    });
  }
}

// The portable batch-invariant kernels: the reference every vector path must match bit for bit.
// Built for the baseline instruction set with -ffp-contract=off (engine/CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/cephes_exp.h"
#include "engine/kernels/bi_kernels.h"

namespace crl::engine::kernels::detail {
namespace {

#include "engine/kernels/bi_rowwise_impl.h"

constexpr int64_t kNr = 16;

// Each output is the canonical chain, computed directly (no packing: the order is the definition).
void gemm(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch) {
  float* acc = scratch;  // [kNr]
  GemmArgs seg[2];
  const int segs = gemm_segments(a, seg);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNr;
    const int64_t cols = a.n - n0 < kNr ? a.n - n0 : kNr;
    int64_t group = 0;  // the row's group of second-segment weights (GemmArgs::groups2)
    for (int64_t row = m0; row < m1; ++row) {
      while (group < a.num_groups2 && a.groups2[group].end <= row) ++group;
      if (a.num_groups2 > 0) seg[1].w = a.groups2[group].w2;
      const int row_segs = segs == 2 && seg[1].w == nullptr ? 1 : segs;
      for (int64_t j = 0; j < cols; ++j) {
        float c = 0.0f;
        for (int si = 0; si < row_segs; ++si) {
          const GemmArgs& s = seg[si];
          const float* x = s.x + row * s.ldx;
          const int64_t w0 = (n0 + j) * s.k;
          for (int64_t kk = 0; kk < s.k; ++kk)
            c = std::fma(x[kk], load_elem(s.w, w0 + kk, s.w_bf16), c);
        }
        acc[j] = c;
      }
      store_outputs(a, row, n0, cols, acc);
    }
  }
}

}  // namespace

const KernelTable kScalarKernels = {"scalar", kNr, 4, 256, gemm, rms_norm_rows, silu_mul};

}  // namespace crl::engine::kernels::detail

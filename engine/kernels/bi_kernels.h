// Internal to engine/kernels: the raw batch-invariant kernels, one table per instruction set.
//
// The canonical arithmetic (every table computes exactly this, so all give the same bits):
//   linear:   y[m, n] = out(c + b[n]) (or out(c) without bias), where c is the chain
//             c = 0; for k = 0 .. K-1: c = fma(x[m, k], w[n, k], c)   (float32, in this order)
//             and out() rounds to the output dtype (bfloat16: round to nearest even; NaN ->
//             0x7FC0). With a second depth segment (GemmArgs::k2 > 0) the chain goes on over it:
//             for j = 0 .. k2-1: c = fma(x2[m, j], w2[n, j], c), i.e. the linear of [x | x2] and
//             [w | w2] (a LoRA delta inside the base product: no second product, no add).
//   rms_norm: s = 16 lane sums, lane l adding x[i]*x[i] (mul, then add) for i = l, l + 16, ...;
//             lanes folded l += l + w for w = 8, 4, 2, 1; r = 1 / sqrt(s / H + eps);
//             y[i] = out(out(x[i] * r) * w[i]).
//   silu_mul: y[i] = out(out(g[i] / (1 + exp_crl(-g[i]))) * u[i]), exp_crl the Cephes polynomial
//             in bi_rowwise_impl.h.
// bfloat16 inputs are widened exactly; all arithmetic is float32.
//
// The ISA translation units include no ATen and no STL templates (an inline function compiled
// with AVX-512 flags could otherwise be the copy the linker keeps for the whole program); their
// code has internal linkage and works on raw pointers. Scratch memory comes from the caller.
#pragma once

#include <cstdint>

namespace crl::engine::kernels::detail {

struct GemmArgs {
  const float* x;  // [m, k] float32, row stride ldx
  int64_t ldx;
  const void* w;  // [n, k] row-major, float32 or bfloat16 (w_bf16)
  bool w_bf16;
  const float* bias;  // [n] float32, or null
  void* y;            // [m, n], float32 or bfloat16 (y_bf16), row stride ldy
  int64_t ldy;
  bool y_bf16;
  int64_t m, n, k;
  // The bf16 dot kernel only (w_bf16 must be set): x as [m, (k + 1) / 2] pairs of bfloat16, row
  // stride ldxp; pair j holds x[., 2j] in its high half and x[., 2j + 1] (zero past k) in its low.
  const uint32_t* xp = nullptr;
  int64_t ldxp = 0;
  // Optional second depth segment (not for the bf16 dot kernel): x2 [m, k2] float32 with row
  // stride ldx2, w2 [n, k2] row-major in w's dtype; k2 = 0: none.
  const float* x2 = nullptr;
  int64_t ldx2 = 0;
  const void* w2 = nullptr;
  int64_t k2 = 0;
  // Optional, with k2 > 0: a second-segment weight per row group instead of w2 for every row. The
  // groups cover rows [0, m) in order, group g ending at groups2[g].end; its rows take
  // groups2[g].w2 ([n, k2], w's dtype) or, where that is null, no second segment (their chains end
  // with the first). Several LoRA adapters in one product.
  const struct RowGroupW2* groups2 = nullptr;
  int64_t num_groups2 = 0;
};

struct RowGroupW2 {
  int64_t end;
  const void* w2;
};

// The depth segments of `a` as arguments of their own (x, w, k the segment's; the outputs a's):
// segment 0 is x w, segment 1 is x2 w2. Returns the number of segments (1 or 2).
inline int gemm_segments(const GemmArgs& a, GemmArgs seg[2]) {
  seg[0] = a;
  seg[0].k2 = 0;
  if (a.k2 <= 0) return 1;
  seg[1] = seg[0];
  seg[1].x = a.x2;
  seg[1].ldx = a.ldx2;
  seg[1].w = a.w2;
  seg[1].k = a.k2;
  return 2;
}

struct RowArgs {
  const void* x;  // rms_norm: [rows, h] input; silu_mul: gate
  const void* w;  // rms_norm: [h] weight; silu_mul: up (same shape as x)
  void* y;        // output, same shape and dtype as x
  bool bf16;      // dtype of x, w and y: bfloat16 (else float32)
  int64_t h;      // row length
  float eps;      // rms_norm epsilon
};

struct KernelTable {
  const char* name;
  int64_t nr;  // output columns per panel
  int64_t mr;  // rows per micro-tile
  int64_t kc;  // depth of one packed panel block
  // Outputs of rows [m0, m1) x panels [p0, p1) (panel p = columns [p * nr, p * nr + nr)), panel
  // by panel. REQUIRES: k > 0. scratch: kc * nr + (m1 - m0) * nr floats.
  void (*gemm)(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch);
  // Rows [r0, r1) of rms_norm.
  void (*rms_norm)(const RowArgs& a, int64_t r0, int64_t r1);
  // Elements [i0, i1) of the flattened silu_mul.
  void (*silu_mul)(const RowArgs& a, int64_t i0, int64_t i1);
};

// The AVX512-BF16 linear (bf16_dot_avx512.cpp) for bfloat16 x and w. vdpbf16ps adds, per lane,
// the product of the pair's high halves and then that of its low halves, each a float32 FMA
// (bfloat16 products are exact) with round to nearest even; with x and w paired as above this is
// the canonical chain, except that bfloat16 denormal inputs read as zero and a denormal partial
// sum flushes to zero (what the instruction does; MXCSR is not consulted).
struct DotKernel {
  const char* name;
  int64_t nr;   // output columns per panel
  int64_t mr;   // rows per micro-tile
  int64_t kcp;  // depth pairs in one packed panel block
  // As KernelTable::gemm. scratch: kcp * nr + (m1 - m0) * nr floats.
  void (*gemm)(const GemmArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1, float* scratch);
};

extern const KernelTable kScalarKernels;
#if defined(__x86_64__)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
extern const DotKernel kAvx512Bf16Dot;
#endif

}  // namespace crl::engine::kernels::detail

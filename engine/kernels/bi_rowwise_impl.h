// Internal to engine/kernels: the row-wise batch-invariant kernels and scalar helpers, included by
// each ISA translation unit (bi_kernels_{scalar,avx2,avx512}.cpp) inside an anonymous namespace,
// so every unit gets its own copy compiled for its instruction set.
//
// Written as plain loops over fixed 16-lane arrays. The units are built with -ffp-contract=off and
// without -ffast-math, so the compiler may vectorize these loops but never fuses or reorders the
// float operations: every instruction set computes the same bits (bi_kernels.h states the
// formulas).
//
// No includes here: the including unit provides <cstdint>, <cstring>, <cmath> and
// common/cephes_exp.h.

constexpr int kLanes = 16;

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even, as c10::BFloat16 does; NaN becomes the canonical quiet NaN.
inline uint16_t float_to_bf16(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float load_elem(const void* p, int64_t i, bool bf16) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Rounds to the output dtype (identity for float32).
inline float round_to(float v, bool bf16) { return bf16 ? bf16_to_float(float_to_bf16(v)) : v; }

inline void store_elem(void* p, int64_t i, float v, bool bf16) {
  if (bf16) {
    static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// exp(x) over the whole float range: exp_cephes (common/cephes_exp.h); 0 below ln(FLT_MIN), +inf
// above 88 (NaN stays NaN). Branch-free.
inline float exp_crl(float x) {
  const bool under = x < kExpMinArg;
  const bool over = x > kExpMaxArg;
  float e = under ? kExpMinArg : x;
  e = over ? kExpMaxArg : e;
  exp_cephes(e);
  e = under ? 0.0f : e;
  return over ? __builtin_inff() : e;
}

template <bool kBf16>
void rms_norm_rows_t(const RowArgs& a, int64_t r0, int64_t r1) {
  const int64_t h = a.h;
  float xs[kLanes];
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t base = row * h;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= h; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) xs[l] = load_elem(a.x, base + i + l, kBf16);
      for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] + xs[l] * xs[l];
    }
    for (int l = 0; i + l < h; ++l) {
      const float v = load_elem(a.x, base + i + l, kBf16);
      acc[l] = acc[l] + v * v;
    }
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
    }
    const float r = 1.0f / std::sqrt(acc[0] / static_cast<float>(h) + a.eps);
    for (int64_t j = 0; j < h; ++j) {
      const float normed = round_to(load_elem(a.x, base + j, kBf16) * r, kBf16);
      store_elem(a.y, base + j, normed * load_elem(a.w, j, kBf16), kBf16);
    }
  }
}

template <bool kBf16>
void silu_mul_t(const RowArgs& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = load_elem(a.x, i, kBf16);
    const float s = round_to(g / (1.0f + exp_crl(-g)), kBf16);
    store_elem(a.y, i, s * load_elem(a.w, i, kBf16), kBf16);
  }
}

void rms_norm_rows(const RowArgs& a, int64_t r0, int64_t r1) {
  if (a.bf16) {
    rms_norm_rows_t<true>(a, r0, r1);
  } else {
    rms_norm_rows_t<false>(a, r0, r1);
  }
}

void silu_mul(const RowArgs& a, int64_t i0, int64_t i1) {
  if (a.bf16) {
    silu_mul_t<true>(a, i0, i1);
  } else {
    silu_mul_t<false>(a, i0, i1);
  }
}

// Writes one finished output row segment: y[row, n0 + j] = out(acc[j] + bias[n0 + j]) for j < cols.
inline void store_outputs(const GemmArgs& a, int64_t row, int64_t n0, int64_t cols,
                          const float* acc) {
  for (int64_t j = 0; j < cols; ++j) {
    const float v = a.bias != nullptr ? acc[j] + a.bias[n0 + j] : acc[j];
    store_elem(a.y, row * a.ldy + n0 + j, v, a.y_bf16);
  }
}

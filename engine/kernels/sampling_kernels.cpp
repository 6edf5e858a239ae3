#include "engine/kernels/sampling_kernels.h"

#include <algorithm>

#include "common/cephes_exp.h"

// Row kernels use GCC/Clang vector extensions (8 floats). On x86-64 GCC they are also cloned for
// AVX2 and chosen at load time; both clones run the same IEEE operations (no FMA), so results are
// bit-identical whichever runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CRL_SAMPLER_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define CRL_SAMPLER_KERNEL
#endif

namespace crl::engine::kernels {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

constexpr int kLanes = 8;

// Vectors go by reference only: a 32-byte vector by value has a different ABI in the AVX2 and
// default clones (and GCC warns). `v8f{} + s` broadcasts s.
inline void load8(const float* p, v8f& v) { v = *reinterpret_cast<const v8f_unaligned*>(p); }
inline void store8(float* p, const v8f& v) { *reinterpret_cast<v8f_unaligned*>(p) = v; }

// Loads min(n, 8) floats (none when n <= 0), padding the other lanes with `pad`.
inline void load_upto(const float* p, int64_t n, float pad, v8f& v) {
  if (n >= kLanes) return load8(p, v);
  float tmp[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) tmp[i] = i < n ? p[i] : pad;
  load8(tmp, v);
}

inline void store_upto(float* p, int64_t n, const v8f& v) {
  if (n >= kLanes) return store8(p, v);
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}

inline float hmax(const v8f& v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

inline double hsum(const v8f& v) {
  double s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// x = exp(x) for x <= 0 (exp_cephes, common/cephes_exp.h); below ln(FLT_MIN), -inf included,
// gives 0.
inline void exp8(v8f& x) {
  const v8f lo = v8f{} + kExpMinArg;
  const v8i under = x < lo;
  x = under ? lo : x;
  exp_cephes(x);
  x = under ? v8f{} : x;
}

}  // namespace

CRL_SAMPLER_KERNEL MaxScan scan_max(const float* x, int64_t n, float* block_max) {
  v8i nan = {};
  MaxScan out;
  for (int64_t b = 0, start = 0; start < n; ++b, start += kSampleBlock) {
    const int64_t len = std::min(kSampleBlock, n - start);
    v8f bm = v8f{} + kNegInf;
    v8f v;
    for (int64_t i = 0; i < len; i += kLanes) {
      load_upto(x + start + i, len - i, kNegInf, v);
      nan |= v != v;
      bm = v > bm ? v : bm;
    }
    block_max[b] = hmax(bm);
    out.max = std::max(out.max, block_max[b]);
  }
  for (int i = 0; i < kLanes; ++i) out.has_nan |= nan[i] != 0;
  return out;
}

CRL_SAMPLER_KERNEL double exp_pass(const float* x, int64_t n, float shift, float scale, float* out,
                                   double* block_sum) {
  const v8f vshift = v8f{} + shift;
  const v8f vscale = v8f{} + scale;
  double total = 0;
  for (int64_t b = 0, start = 0; start < n; ++b, start += kSampleBlock) {
    const int64_t len = std::min(kSampleBlock, n - start);
    v8f acc = {}, acc2 = {};  // two independent polynomial chains keep the FP units busy
    for (int64_t i = 0; i < len; i += 2 * kLanes) {
      v8f e, e2;
      load_upto(x + start + i, len - i, kNegInf, e);
      load_upto(x + start + i + kLanes, len - i - kLanes, kNegInf, e2);
      e = (e - vshift) * vscale;
      e2 = (e2 - vshift) * vscale;
      exp8(e);
      exp8(e2);
      if (out) {
        store_upto(out + start + i, len - i, e);
        store_upto(out + start + i + kLanes, len - i - kLanes, e2);
      }
      acc += e;
      acc2 += e2;
    }
    acc += acc2;
    const double s = hsum(acc);
    if (block_sum) block_sum[b] = s;
    total += s;
  }
  return total;
}

CRL_SAMPLER_KERNEL double sum_blocks(const float* q, int64_t n, double* block_sum) {
  double total = 0;
  for (int64_t b = 0, start = 0; start < n; ++b, start += kSampleBlock) {
    const int64_t len = std::min(kSampleBlock, n - start);
    v8f acc = {};
    v8f v;
    for (int64_t i = 0; i < len; i += kLanes) {
      load_upto(q + start + i, len - i, 0.0f, v);
      acc += v;
    }
    block_sum[b] = hsum(acc);
    total += block_sum[b];
  }
  return total;
}

CRL_SAMPLER_KERNEL void zero_below(float* q, int64_t n, float q_min, int32_t id_min) {
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  const v8f vq_min = v8f{} + q_min;
  const v8i vid_min = v8i{} + id_min;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    v8f v;
    load8(q + i, v);
    const v8i idx = lane + static_cast<int32_t>(i);
    const v8i drop = (v < vq_min) | ((v == vq_min) & (idx > vid_min));
    v = drop ? v8f{} : v;
    store8(q + i, v);
  }
  for (; i < n; ++i) {
    if (q[i] < q_min || (q[i] == q_min && i > id_min)) q[i] = 0.0f;
  }
}

}  // namespace crl::engine::kernels

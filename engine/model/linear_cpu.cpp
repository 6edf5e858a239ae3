// CPU GEMV for a few rows: streams each weight row once and applies it to every input row.
// Compiled with -march=native (engine/CMakeLists.txt); inner loops keep 16 independent partial
// sums so GCC vectorizes them without reassociating a single reduction.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cstring>
#include <type_traits>

#include "engine/model/linear.h"

namespace crl::engine::detail {

namespace {

constexpr int64_t kLanes = 16;

inline float load(const float* p) { return *p; }
inline float load(const c10::BFloat16* p) {
  uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[0]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The 16 lane sums of one dot product, plus the tail past the last whole group of lanes, in a
// fixed order: shared by the one-row and the four-row loops so a weight row gives the same bits in
// either.
template <typename T>
inline float finish(const float* acc, const float* __restrict x, const T* __restrict w,
                    int64_t main, int64_t k) {
  float tail = 0;
  for (int64_t i = main; i < k; ++i) tail += x[i] * load(w + i);
  float s = 0;
  for (int64_t l = 0; l < kLanes; ++l) s += acc[l];
  return s + tail;
}

// out[r][m] = dot(x[m, :K], w[r, :K]) for R consecutive weight rows and M input rows, each in the
// same fixed lane-wise order whatever R is. With one weight row a single accumulator chain waits
// on the FMA latency; with four the chains overlap and the loop streams the weights at the
// memory's pace (batch-1 decode reads every weight once a step). The accumulators are GCC vector
// types so that they stay in registers (plain arrays spilled and ran 4x slower at two rows).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int64_t M, int64_t R>
inline void dot_block(const float* __restrict x, const float* __restrict w, int64_t k,
                      float (*out)[M]) {
  Lanes acc[R][M] = {};
  const int64_t main = k - k % kLanes;
  for (int64_t i = 0; i < main; i += kLanes) {
    Lanes xv[M];
    for (int64_t m = 0; m < M; ++m) xv[m] = load_lanes(x + m * k + i);
    for (int64_t r = 0; r < R; ++r) {
      const Lanes wv = load_lanes(w + r * k + i);
      for (int64_t m = 0; m < M; ++m) acc[r][m] += xv[m] * wv;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t m = 0; m < M; ++m) {
      float a[kLanes];
      std::memcpy(a, &acc[r][m], sizeof(a));
      out[r][m] = finish(a, x + m * k, w + r * k, main, k);
    }
  }
}

// bfloat16 weights: one row at a time with plain arrays, which GCC widens well (in vector types the
// widening went lane by lane: 2.5x slower).
template <int64_t M>
inline void dot_rows(const float* __restrict x, const c10::BFloat16* __restrict w, int64_t k,
                     float* out) {
  float acc[M][kLanes] = {};
  const int64_t main = k - k % kLanes;
  for (int64_t i = 0; i < main; i += kLanes) {
    float wf[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) wf[l] = load(w + i + l);
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * k + i;
      for (int64_t l = 0; l < kLanes; ++l) acc[m][l] += xm[l] * wf[l];
    }
  }
  for (int64_t m = 0; m < M; ++m) out[m] = finish(acc[m], x + m * k, w, main, k);
}

template <typename T, int64_t M>
void run(const float* x, const T* w, const T* bias, T* y, int64_t n, int64_t k) {
  auto store = [&](int64_t j, const float* out) {
    const float b = bias ? load(bias + j) : 0.0f;
    for (int64_t m = 0; m < M; ++m) y[m * n + j] = static_cast<T>(out[m] + b);
  };
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    int64_t j = begin;
    if constexpr (!std::is_same_v<T, float>) {
      for (; j < end; ++j) {
        float out[M];
        dot_rows<M>(x, w + j * k, k, out);
        store(j, out);
      }
    } else {
      if constexpr (M <= 2) {  // (at 3-4 input rows the accumulators of four weight rows spill)
        for (; j + 4 <= end; j += 4) {
          float out[4][M];
          dot_block<M, 4>(x, w + j * k, k, out);
          for (int64_t r = 0; r < 4; ++r) store(j + r, out[r]);
        }
      }
      for (; j < end; ++j) {
        float out[1][M];
        dot_block<M, 1>(x, w + j * k, k, out);
        store(j, out[0]);
      }
    }
  });
}

template <typename T>
void dispatch_rows(int64_t m, const float* x, const T* w, const T* b, T* y, int64_t n, int64_t k) {
  switch (m) {
    case 1:
      return run<T, 1>(x, w, b, y, n, k);
    case 2:
      return run<T, 2>(x, w, b, y, n, k);
    case 3:
      return run<T, 3>(x, w, b, y, n, k);
    case 4:
      return run<T, 4>(x, w, b, y, n, k);
    default:
      for (int64_t r = 0; r < m; r += 4) {
        const int64_t rows = std::min<int64_t>(4, m - r);
        dispatch_rows<T>(rows, x + r * k, w, b, y + r * n, n, k);
      }
  }
}

}  // namespace

at::Tensor gemv_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(weight.size(1) == k, "linear: x has ", k, " columns, weight ", weight.sizes());
  auto xf = x.to(at::kFloat).contiguous();  // activations in float32 (small)
  auto y = at::empty({m, n}, x.options());
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  if (x.scalar_type() == at::kFloat) {
    dispatch_rows<float>(m, xf.data_ptr<float>(), weight.data_ptr<float>(),
                         b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), n, k);
  } else {
    dispatch_rows<c10::BFloat16>(m, xf.data_ptr<float>(), weight.data_ptr<c10::BFloat16>(),
                                 b.defined() ? b.data_ptr<c10::BFloat16>() : nullptr,
                                 y.data_ptr<c10::BFloat16>(), n, k);
  }
  return y;
}

}  // namespace crl::engine::detail

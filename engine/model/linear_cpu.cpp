// CPU GEMV for a few rows: streams each weight row once and applies it to every input row.
// Compiled with -march=native (engine/CMakeLists.txt); inner loops keep 16 independent partial
// sums so GCC vectorizes them without reassociating a single reduction.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cstring>

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

// acc[m] = dot(x[m, :K], w[:K]) for m < M, with fixed lane-wise order.
template <typename T, int64_t M>
inline void dot_rows(const float* __restrict x, const T* __restrict w, int64_t k, float* out) {
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
  for (int64_t m = 0; m < M; ++m) {
    float tail = 0;
    for (int64_t i = main; i < k; ++i) tail += x[m * k + i] * load(w + i);
    float s = 0;
    for (int64_t l = 0; l < kLanes; ++l) s += acc[m][l];
    out[m] = s + tail;
  }
}

template <typename T, int64_t M>
void run(const float* x, const T* w, const T* bias, T* y, int64_t n, int64_t k) {
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    float out[M];
    for (int64_t j = begin; j < end; ++j) {
      dot_rows<T, M>(x, w + j * k, k, out);
      const float b = bias ? load(bias + j) : 0.0f;
      for (int64_t m = 0; m < M; ++m) y[m * n + j] = static_cast<T>(out[m] + b);
    }
  });
}

template <typename T>
void dispatch_rows(int64_t m, const float* x, const T* w, const T* b, T* y, int64_t n, int64_t k) {
  switch (m) {
    case 1: return run<T, 1>(x, w, b, y, n, k);
    case 2: return run<T, 2>(x, w, b, y, n, k);
    case 3: return run<T, 3>(x, w, b, y, n, k);
    case 4: return run<T, 4>(x, w, b, y, n, k);
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

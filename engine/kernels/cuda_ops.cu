// The fused CUDA ops (contract in engine/kernels/cuda_ops.h). Each rounds to the compute dtype
// where the ATen composition it replaces rounds (every ATen bfloat16 op computes in float and
// rounds its result), and multiplies with __fmul_rn where ATen multiplies in its own op, so that
// no product is fused into an add that ATen computes separately.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "common/check.h"
#include "engine/kernels/cuda_ops.h"

namespace crl::engine::kernels {

namespace {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
// x rounded to T and back: what an ATen op with a T result stores.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_f(from_f<T>(x));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The sum of `v` over the block (every thread gets it); blockDim.x a multiple of 32, <= 1024.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// One block per row.
template <typename T>
__global__ void rms_norm_kernel(T* __restrict__ out, const T* __restrict__ x,
                                const T* __restrict__ w, int h, float inv_h, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * h;
  T* orow = out + row * h;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_h), eps));  // mean(x^2) + eps
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    const float normed = round_to<T>(__fmul_rn(to_f(xr[i]), r));
    orow[i] = from_f<T>(__fmul_rn(normed, to_f(w[i])));
  }
}

template <typename T>
__global__ void silu_mul_kernel(T* __restrict__ out, const T* __restrict__ gate,
                                const T* __restrict__ up, int64_t n, int64_t width,
                                int64_t gate_stride, int64_t up_stride) {
  // Row r of gate and up starts r * stride elements in (the halves of a merged gate/up product
  // are rows apart); out is [n / width, width], contiguous. Contiguous inputs skip the division.
  const bool flat = gate_stride == width && up_stride == width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t gi = i, ui = i;
    if (!flat) {
      const int64_t r = i / width, c = i - r * width;
      gi = r * gate_stride + c;
      ui = r * up_stride + c;
    }
    const float g = to_f(gate[gi]);
    const float s = round_to<T>(g / (1.0f + expf(-g)));  // ATen's silu, in float
    out[i] = from_f<T>(__fmul_rn(s, to_f(up[ui])));
  }
}

// One block per token; a thread per (head, pair) of q's heads then k's.
template <typename T>
__global__ void rope_kernel(T* __restrict__ q, T* __restrict__ k,
                            const int64_t* __restrict__ positions,
                            const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, int hq, int hk, int half,
                            int64_t q_stride, int64_t k_stride) {
  const int64_t t = blockIdx.x;
  const int64_t p = positions[t];
  const float* ct = cos_table + p * half;
  const float* st = sin_table + p * half;
  const int pairs = (hq + hk) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / half, j = i % half;
    // Token t's heads start t * stride elements in (rows of a merged q/k/v product).
    T* x =
        head < hq ? q + t * q_stride + head * 2 * half : k + t * k_stride + (head - hq) * 2 * half;
    const float c = round_to<T>(ct[j]), s = round_to<T>(st[j]);
    const float x1 = to_f(x[j]), x2 = to_f(x[j + half]);
    // cat({x1 * c - x2 * s, x2 * c + x1 * s}): each product and each sum an ATen op.
    const float a = round_to<T>(__fmul_rn(x1, c)), b = round_to<T>(__fmul_rn(x2, s));
    const float d = round_to<T>(__fmul_rn(x2, c)), e = round_to<T>(__fmul_rn(x1, s));
    x[j] = from_f<T>(__fsub_rn(a, b));
    x[j + half] = from_f<T>(__fadd_rn(d, e));
  }
}

// --- The plain-row sampler (cuda_sample_plain_rows) ---
//
// A block per row. Pass 1 reads the row for its maximum, first argmax and NaNs; pass 2 gives each
// warp a contiguous segment of ids and sums there exp(x - max) (float: the raw log-sum-exp) and,
// for a sampled row, q = exp((x - max) * scale) (double: the draw's mass). The draw then finds the
// segment whose running sum passes uniform * mass, splits it among the warps again for the
// sub-segment, and one warp walks that sub-segment's ids in order to the first running sum above
// the target: the tensor sampler's inverse CDF in id order, in a few warp steps. The passes load
// 16 bytes a thread at a time, several in flight, where the rows are 16-byte aligned (vocab a
// multiple of 4): the row reads, not the arithmetic, set this kernel's time.

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;

// Field rows of the tensor sampler's params [8, R] (engine/tensor_sampler.cpp, enum Field).
enum SampleField { kFRow = 0, kFScale = 1, kFInvT = 2, kFUniform = 6, kFGreedy = 7 };

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// q of one logit: exp((x - max) * scale) in float, each step an ATen op of its own.
__device__ __forceinline__ float plain_q(float x, float zmax, float scale) {
  return expf(__fmul_rn(__fsub_rn(x, zmax), scale));
}

// Calls f(value, id) for ids lane, lane + stride, ... in [begin, end) (kVec: begin and stride
// multiples of 4, ids taken 4 at a time as one 16-byte load; end - begin a multiple of 4).
template <bool kVec, typename F>
__device__ __forceinline__ void visit(const float* __restrict__ x, int64_t begin, int64_t end,
                                      int lane, int stride, F&& f) {
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 2
    for (int64_t j = begin / 4 + lane; j < end / 4; j += stride) {
      const float4 v = __ldg(x4 + j);
      f(v.x, 4 * j);
      f(v.y, 4 * j + 1);
      f(v.z, 4 * j + 2);
      f(v.w, 4 * j + 3);
    }
  } else {
#pragma unroll 4
    for (int64_t i = begin + lane; i < end; i += stride) f(__ldg(x + i), i);
  }
}

// (max, first index of the max): the larger value, the lower index on a tie.
__device__ __forceinline__ void max_merge(float& m, int& idx, float om, int oidx) {
  if (om > m || (om == m && oidx < idx)) {
    m = om;
    idx = oidx;
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kSampleThreads)
    sample_plain_kernel(int32_t* __restrict__ out, const float* __restrict__ logits,
                        const double* __restrict__ params, int64_t num_rows, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t logit_row = static_cast<int64_t>(params[kFRow * num_rows + r]);
  const float* x = logits + logit_row * vocab;
  __shared__ float warp_m[kSampleWarps];
  __shared__ int warp_idx[kSampleWarps];
  __shared__ int warp_nan[kSampleWarps];
  __shared__ float seg_raw[kSampleWarps];
  __shared__ double seg_sum[kSampleWarps];
  __shared__ double sub_sum[kSampleWarps];
  __shared__ float row_m;
  __shared__ int row_idx, row_nan, drawn;

  // Pass 1: max, first argmax, NaN (coalesced, any order).
  float m = -INFINITY;
  int idx = 0x7fffffff, nan = 0;
  visit<kVec>(x, 0, vocab, tid, kSampleThreads, [&](float v, int64_t i) {
    if (isnan(v)) {
      nan = 1;
    } else {
      max_merge(m, idx, v, static_cast<int>(i));
    }
  });
  for (int off = 16; off > 0; off /= 2) {
    max_merge(m, idx, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, idx, off));
    nan |= __shfl_xor_sync(0xffffffffu, nan, off);
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_idx[warp] = idx;
    warp_nan[warp] = nan;
  }
  __syncthreads();
  if (tid == 0) {
    float bm = warp_m[0];
    int bidx = warp_idx[0], any_nan = warp_nan[0];
    for (int w = 1; w < kSampleWarps; ++w) {
      max_merge(bm, bidx, warp_m[w], warp_idx[w]);
      any_nan |= warp_nan[w];
    }
    row_m = bm;
    row_idx = bidx;
    row_nan = any_nan;
  }
  __syncthreads();
  const float zmax = row_m;
  const bool bad = row_nan != 0 || isinf(zmax);
  const bool greedy = params[kFGreedy * num_rows + r] > 0.5;
  const bool sampled = !greedy && !bad;
  const float scale = static_cast<float>(params[kFScale * num_rows + r]);

  // Pass 2: each warp's contiguous segment (a multiple of 128 ids: whole 16-byte loads).
  const int64_t seg = ((vocab + kSampleWarps - 1) / kSampleWarps + 127) / 128 * 128;
  const int64_t begin = min(vocab, warp * seg), end = min(vocab, begin + seg);
  float raw_part = 0.0f;
  double part = 0.0;
  if (!isinf(zmax)) {
    visit<kVec>(x, begin, end, lane, 32, [&](float v, int64_t) {
      if (isnan(v)) return;
      const float e = expf(__fsub_rn(v, zmax));
      raw_part += e;
      if (sampled) part += static_cast<double>(scale == 1.0f ? e : plain_q(v, zmax, scale));
    });
  }
  raw_part = warp_sum(raw_part);
  part = warp_sum_d(part);
  if (lane == 0) {
    seg_raw[warp] = raw_part;
    seg_sum[warp] = part;
  }
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kSampleWarps; ++w) s += seg_raw[w];
  const float lse = zmax + logf(s);

  int token = row_idx;
  float processed = 0.0f;
  if (sampled) {
    // Every thread forms the prefix sums (32 values) and the target itself.
    double mass = 0.0;
    for (int w = 0; w < kSampleWarps; ++w) mass += seg_sum[w];
    const double target = params[kFUniform * num_rows + r] * mass;
    int first_w = kSampleWarps;
    double prefix = 0.0;
    for (int w = 0; w < kSampleWarps; ++w) {
      if (prefix + seg_sum[w] > target) {
        first_w = w;
        break;
      }
      prefix += seg_sum[w];
    }
    if (tid == 0) drawn = static_cast<int>(vocab - 1);  // target at or past the total: the last id
    if (first_w < kSampleWarps) {
      // That segment split among the warps: each sums its sub-segment's q.
      const int64_t sb = first_w * seg, se = min(vocab, sb + seg);
      const int64_t sub = (seg / kSampleWarps + 3) / 4 * 4;
      const int64_t b2 = min(se, sb + warp * sub), e2 = min(se, b2 + sub);
      double p2 = 0.0;
      for (int64_t i = b2 + lane; i < e2; i += 32)
        p2 += static_cast<double>(plain_q(x[i], zmax, scale));
      p2 = warp_sum_d(p2);
      if (lane == 0) sub_sum[warp] = p2;
      __syncthreads();
      int first_s =
          kSampleWarps - 1;  // rounding past every sub-sum: the walk goes on from the last
      double prefix2 = prefix;
      for (int w = 0; w < kSampleWarps - 1; ++w) {
        if (prefix2 + sub_sum[w] > target) {
          first_s = w;
          break;
        }
        prefix2 += sub_sum[w];
      }
      // One warp walks ids in order from that sub-segment (on past it if rounding says so) to the
      // first running sum above the target.
      if (warp == 0) {
        double running = prefix2;
        for (int64_t base = min(se, sb + first_s * sub); base < vocab; base += 32) {
          const int64_t i = base + lane;
          double v = i < vocab ? static_cast<double>(plain_q(x[i], zmax, scale)) : 0.0;
          for (int off = 1; off < 32; off *= 2) {  // inclusive scan
            const double o = __shfl_up_sync(0xffffffffu, v, off);
            if (lane >= off) v += o;
          }
          const unsigned hit = __ballot_sync(0xffffffffu, i < vocab && running + v > target);
          if (hit != 0) {
            if (lane == 0) drawn = static_cast<int>(base + __ffs(hit) - 1);
            break;
          }
          running += __shfl_sync(0xffffffffu, v, 31);
        }
      }
    }
    __syncthreads();
    token = drawn;
    const double inv_t = params[kFInvT * num_rows + r];
    const double logp =
        (static_cast<double>(x[token]) - static_cast<double>(zmax)) * inv_t - log(mass);
    processed = static_cast<float>(fmin(logp, 0.0));
  }
  if (tid == 0) {
    const float raw = __fsub_rn(x[token], lse);
    out[r] = token;
    out[num_rows + r] = __float_as_int(raw);
    out[2 * num_rows + r] = __float_as_int(processed);
    out[3 * num_rows + r] = bad ? 1 : 0;
  }
}

// Whether t is contiguous but for its first dimension's stride (rows apart: the parts of a merged
// projection's output).
bool rows_contiguous(const at::Tensor& t) {
  if (t.dim() < 2) return t.is_contiguous();
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return t.size(0) == 1 || t.stride(0) >= expected;
}

// Elements between two rows (first-dimension entries) of t.
int64_t row_stride(const at::Tensor& t) {
  if (t.dim() < 2) return t.numel();
  return t.size(0) == 1 ? t.numel() : t.stride(0);
}

void check_operand(const at::Tensor& t, const char* what, const at::Tensor& like,
                   bool rows_apart = false) {
  CRL_CHECK(t.defined() && t.is_cuda(), what, " must be a CUDA tensor");
  CRL_CHECK(t.scalar_type() == like.scalar_type(), what, " is ", t.scalar_type(), ", expected ",
            like.scalar_type());
  CRL_CHECK(t.device() == like.device(), what, " is on ", t.device(), ", expected ", like.device());
  if (rows_apart) {
    CRL_CHECK(rows_contiguous(t), what, " must be contiguous within each row");
  } else {
    CRL_CHECK(t.is_contiguous(), what, " must be contiguous");
  }
}

void check_dtype(const at::Tensor& t) {
  CRL_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
            "the fused CUDA ops take float32 or bfloat16, got ", t.scalar_type());
}

int threads_for(int64_t work) {
  const int64_t warps = std::min<int64_t>(32, std::max<int64_t>(1, (work + 31) / 32));
  return static_cast<int>(warps * 32);
}

}  // namespace

bool cuda_ops_built() { return true; }

at::Tensor cuda_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_operand(x, "rms_norm input", x);
  check_dtype(x);
  check_operand(weight, "rms_norm weight", x);
  CRL_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1), "rms_norm: input ",
            x.sizes(), " and weight ", weight.sizes(), " do not match");
  at::Tensor out = at::empty_like(x);
  const int64_t rows = x.size(0);
  const int h = static_cast<int>(x.size(1));
  if (rows == 0 || h == 0) return out;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = std::min(256, threads_for(h));
  if (x.scalar_type() == at::kFloat) {
    rms_norm_kernel<float><<<rows, threads, 0, stream>>>(out.data_ptr<float>(), x.data_ptr<float>(),
                                                         weight.data_ptr<float>(), h, 1.0f / h,
                                                         static_cast<float>(eps));
  } else {
    rms_norm_kernel<__nv_bfloat16>
        <<<rows, threads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(out.data_ptr()),
                                       reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
                                       reinterpret_cast<const __nv_bfloat16*>(weight.data_ptr()), h,
                                       1.0f / h, static_cast<float>(eps));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor cuda_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_operand(gate, "silu_mul gate", gate, /*rows_apart=*/true);
  check_dtype(gate);
  check_operand(up, "silu_mul up", gate, /*rows_apart=*/true);
  CRL_CHECK(gate.sizes() == up.sizes(), "silu_mul: gate ", gate.sizes(), " and up ", up.sizes(),
            " differ");
  CRL_CHECK((gate.is_contiguous() && up.is_contiguous()) || gate.dim() == 2,
            "silu_mul: rows apart only in 2-D, got gate ", gate.sizes());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const int64_t n = gate.numel();
  const int64_t width = gate.dim() == 2 ? gate.size(1) : std::max<int64_t>(n, 1);
  const int64_t gate_stride = gate.dim() == 2 ? row_stride(gate) : width;
  const int64_t up_stride = gate.dim() == 2 ? row_stride(up) : width;
  if (n == 0) return out;
  const c10::cuda::CUDAGuard guard(gate.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 8192);
  if (gate.scalar_type() == at::kFloat) {
    silu_mul_kernel<float>
        <<<blocks, threads, 0, stream>>>(out.data_ptr<float>(), gate.data_ptr<float>(),
                                         up.data_ptr<float>(), n, width, gate_stride, up_stride);
  } else {
    silu_mul_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr()),
        reinterpret_cast<const __nv_bfloat16*>(gate.data_ptr()),
        reinterpret_cast<const __nv_bfloat16*>(up.data_ptr()), n, width, gate_stride, up_stride);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void cuda_rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& positions,
                const at::Tensor& cos_table, const at::Tensor& sin_table) {
  check_operand(q, "rope q", q, /*rows_apart=*/true);
  check_dtype(q);
  check_operand(k, "rope k", q, /*rows_apart=*/true);
  CRL_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                q.size(2) % 2 == 0,
            "rope: q ", q.sizes(), " and k ", k.sizes(),
            " must be [T, heads, head_dim] with one even head_dim");
  const int64_t tokens = q.size(0);
  const int half = static_cast<int>(q.size(2) / 2);
  CRL_CHECK(positions.is_cuda() && positions.scalar_type() == at::kLong && positions.dim() == 1 &&
                positions.size(0) == tokens && positions.is_contiguous(),
            "rope: positions must be [", tokens, "] int64 on the device");
  for (const at::Tensor* t : {&cos_table, &sin_table}) {
    CRL_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                  t->dim() == 2 && t->size(1) == half && t->device() == q.device(),
              "rope: tables must be [positions, ", half, "] float32 on ", q.device());
  }
  if (tokens == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int hq = static_cast<int>(q.size(1)), hk = static_cast<int>(k.size(1));
  const int threads = std::min(512, threads_for(static_cast<int64_t>(hq + hk) * half));
  if (q.scalar_type() == at::kFloat) {
    rope_kernel<float><<<tokens, threads, 0, stream>>>(
        q.data_ptr<float>(), k.data_ptr<float>(), positions.data_ptr<int64_t>(),
        cos_table.data_ptr<float>(), sin_table.data_ptr<float>(), hq, hk, half, q.stride(0),
        k.stride(0));
  } else {
    rope_kernel<__nv_bfloat16><<<tokens, threads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(q.data_ptr()),
        reinterpret_cast<__nv_bfloat16*>(k.data_ptr()), positions.data_ptr<int64_t>(),
        cos_table.data_ptr<float>(), sin_table.data_ptr<float>(), hq, hk, half, q.stride(0),
        k.stride(0));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor cuda_sample_plain_rows(const at::Tensor& logits, const at::Tensor& params) {
  CRL_CHECK(logits.is_cuda() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
                logits.is_contiguous(),
            "plain-row sampler: logits must be [N, V] float32, contiguous, on a CUDA device");
  CRL_CHECK(params.is_cuda() && params.scalar_type() == at::kDouble && params.dim() == 2 &&
                params.size(0) == 8 && params.is_contiguous() && params.device() == logits.device(),
            "plain-row sampler: params must be [8, R] float64 on ", logits.device());
  CRL_CHECK(logits.size(1) < (int64_t{1} << 31), "plain-row sampler: vocabulary too large");
  const int64_t rows = params.size(1);
  at::Tensor out = at::empty({4, rows}, logits.options().dtype(at::kInt));
  if (rows == 0) return out;
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t vocab = logits.size(1);
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec) {
    sample_plain_kernel<true><<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
        out.data_ptr<int32_t>(), logits.data_ptr<float>(), params.data_ptr<double>(), rows, vocab);
  } else {
    sample_plain_kernel<false><<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
        out.data_ptr<int32_t>(), logits.data_ptr<float>(), params.data_ptr<double>(), rows, vocab);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace crl::engine::kernels

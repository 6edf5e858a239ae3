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
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// x rounded to T and back: what an ATen op with a T result stores.
template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_f(from_f<T>(x)); }

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
__global__ void rms_norm_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                                int h, float inv_h, float eps) {
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
__global__ void silu_mul_kernel(T* __restrict__ out, const T* __restrict__ gate, const T* __restrict__ up,
                                int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    const float s = round_to<T>(g / (1.0f + expf(-g)));  // ATen's silu, in float
    out[i] = from_f<T>(__fmul_rn(s, to_f(up[i])));
  }
}

// One block per token; a thread per (head, pair) of q's heads then k's.
template <typename T>
__global__ void rope_kernel(T* __restrict__ q, T* __restrict__ k, const int64_t* __restrict__ positions,
                            const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                            int hq, int hk, int half) {
  const int64_t t = blockIdx.x;
  const int64_t p = positions[t];
  const float* ct = cos_table + p * half;
  const float* st = sin_table + p * half;
  const int pairs = (hq + hk) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / half, j = i % half;
    T* x = head < hq ? q + (t * hq + head) * 2 * half : k + (t * hk + (head - hq)) * 2 * half;
    const float c = round_to<T>(ct[j]), s = round_to<T>(st[j]);
    const float x1 = to_f(x[j]), x2 = to_f(x[j + half]);
    // cat({x1 * c - x2 * s, x2 * c + x1 * s}): each product and each sum an ATen op.
    const float a = round_to<T>(__fmul_rn(x1, c)), b = round_to<T>(__fmul_rn(x2, s));
    const float d = round_to<T>(__fmul_rn(x2, c)), e = round_to<T>(__fmul_rn(x1, s));
    x[j] = from_f<T>(__fsub_rn(a, b));
    x[j + half] = from_f<T>(__fadd_rn(d, e));
  }
}

void check_operand(const at::Tensor& t, const char* what, const at::Tensor& like) {
  CRL_CHECK(t.defined() && t.is_cuda(), what, " must be a CUDA tensor");
  CRL_CHECK(t.scalar_type() == like.scalar_type(), what, " is ", t.scalar_type(), ", expected ",
            like.scalar_type());
  CRL_CHECK(t.device() == like.device(), what, " is on ", t.device(), ", expected ", like.device());
  CRL_CHECK(t.is_contiguous(), what, " must be contiguous");
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
    rms_norm_kernel<__nv_bfloat16><<<rows, threads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
        reinterpret_cast<const __nv_bfloat16*>(weight.data_ptr()), h, 1.0f / h, static_cast<float>(eps));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor cuda_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_operand(gate, "silu_mul gate", gate);
  check_dtype(gate);
  check_operand(up, "silu_mul up", gate);
  CRL_CHECK(gate.sizes() == up.sizes(), "silu_mul: gate ", gate.sizes(), " and up ", up.sizes(),
            " differ");
  at::Tensor out = at::empty_like(gate);
  const int64_t n = gate.numel();
  if (n == 0) return out;
  const c10::cuda::CUDAGuard guard(gate.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 8192);
  if (gate.scalar_type() == at::kFloat) {
    silu_mul_kernel<float><<<blocks, threads, 0, stream>>>(out.data_ptr<float>(), gate.data_ptr<float>(),
                                                          up.data_ptr<float>(), n);
  } else {
    silu_mul_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(gate.data_ptr()),
        reinterpret_cast<const __nv_bfloat16*>(up.data_ptr()), n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void cuda_rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos_table,
                const at::Tensor& sin_table) {
  check_operand(q, "rope q", q);
  check_dtype(q);
  check_operand(k, "rope k", q);
  CRL_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                q.size(2) % 2 == 0,
            "rope: q ", q.sizes(), " and k ", k.sizes(), " must be [T, heads, head_dim] with one even head_dim");
  const int64_t tokens = q.size(0);
  const int half = static_cast<int>(q.size(2) / 2);
  CRL_CHECK(positions.is_cuda() && positions.scalar_type() == at::kLong && positions.dim() == 1 &&
                positions.size(0) == tokens && positions.is_contiguous(),
            "rope: positions must be [", tokens, "] int64 on the device");
  for (const at::Tensor* t : {&cos_table, &sin_table}) {
    CRL_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                  t->size(1) == half && t->device() == q.device(),
              "rope: tables must be [positions, ", half, "] float32 on ", q.device());
  }
  if (tokens == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int hq = static_cast<int>(q.size(1)), hk = static_cast<int>(k.size(1));
  const int threads = std::min(512, threads_for(static_cast<int64_t>(hq + hk) * half));
  if (q.scalar_type() == at::kFloat) {
    rope_kernel<float><<<tokens, threads, 0, stream>>>(q.data_ptr<float>(), k.data_ptr<float>(),
                                                       positions.data_ptr<int64_t>(), cos_table.data_ptr<float>(),
                                                       sin_table.data_ptr<float>(), hq, hk, half);
  } else {
    rope_kernel<__nv_bfloat16><<<tokens, threads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(q.data_ptr()), reinterpret_cast<__nv_bfloat16*>(k.data_ptr()),
        positions.data_ptr<int64_t>(), cos_table.data_ptr<float>(), sin_table.data_ptr<float>(), hq, hk, half);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace crl::engine::kernels

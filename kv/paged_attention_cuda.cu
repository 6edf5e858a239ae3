// CUDA kernels for paged attention (contract in kv/paged_attention.h), built only with
// CRL_WITH_CUDA. Inputs were validated by the dispatcher in paged_attention.cpp; metadata values on
// the GPU are trusted (checking them would need a device sync per call).
//
// Two kernels of the project's own (kv::CudaAttentionKernel): v4, the default where head_dim is 32,
// 64 or 128 and FlashInfer's decode (paged_attention_flashinfer.cu) does not fit, and v2 for every
// other head_dim. Both split a row's context over the warps of a block, keep an online
// softmax (max, sum, accumulator) per warp, and merge the warps' states in warp order at the end
// (merge_warp_states). The reduction order depends only on the row's own data, so results are
// batch-invariant and deterministic (not bit-identical to the CPU kernel). (v1, one position per
// warp iteration, and v3, one block per KV head for all its query heads, were retired: both lost
// to v2 and v4 on every GPU measured, README "GPU".)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kv/paged_attention.h"
#ifdef CRL_WITH_FLASHINFER
#include "kv/paged_attention_flashinfer.h"
#endif

namespace crl::kv::detail {

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxPerLane = 8;  // head_dim <= kMaxPerLane * kWarpSize = 256

__device__ __forceinline__ float load_float(const float* p) { return *p; }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_float(float x, float* p) { *p = x; }
__device__ __forceinline__ void store_float(float x, __nv_bfloat16* p) {
  *p = __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Query row `row`'s sequence (query_start: the rows' offsets per sequence, [num_seqs + 1]) and the
// number of context positions it attends to, its own included.
struct RowContext {
  int seq;
  int n;
};
__device__ __forceinline__ RowContext row_context(const int32_t* query_start,
                                                  const int32_t* context_lens, int num_seqs,
                                                  int row) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int q0 = query_start[lo];
  const int q_len = query_start[lo + 1] - q0;
  return {lo, context_lens[lo] - q_len + (row - q0) + 1};
}

// The merged output of `warps` warps' online-softmax states for one element: their running maxima
// m[w * ml_stride], sums l[w * ml_stride] and accumulators acc[w * acc_stride], in warp order. A
// warp that saw no position has m = -inf and contributes nothing.
__device__ __forceinline__ float merge_warp_states(const float* m, const float* l, int ml_stride,
                                                   const float* acc, int acc_stride, int warps) {
  float m_all = -INFINITY;
  for (int w = 0; w < warps; ++w) m_all = fmaxf(m_all, m[w * ml_stride]);
  float l_all = 0.0f, o = 0.0f;
  for (int w = 0; w < warps; ++w) {
    const float c = m[w * ml_stride] == -INFINITY ? 0.0f : expf(m[w * ml_stride] - m_all);
    l_all += l[w * ml_stride] * c;
    o += acc[w * acc_stride] * c;
  }
  return o / l_all;
}

// v2: one thread block per (row, query head), kWarps warps, each taking kUnroll consecutive
// positions per iteration (their table entries, K and V rows all loaded before the first use, the
// kUnroll dot products reduced together by butterfly warp sums); each lane holds kPer = head_dim /
// 32 (rounded up) dimensions, so registers follow head_dim. Warp w walks positions
// [w * kUnroll, w * kUnroll + kUnroll), then kWarps * kUnroll further on.
constexpr int kUnroll = 4;

template <typename T, int kPer>
__global__ void paged_attention_unrolled_kernel(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int32_t* __restrict__ query_start,
    const int32_t* __restrict__ context_lens, const int32_t* __restrict__ block_tables,
    int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks,
    float scale) {
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  const RowContext ctx = row_context(query_start, context_lens, num_seqs, row);
  const int n = ctx.n;  // attended positions
  const int kv_head = head / (num_heads / num_kv_heads);
  const int32_t* table = block_tables + static_cast<int64_t>(ctx.seq) * max_blocks;

  float qr[kPer];
  const T* q_row = q + (static_cast<int64_t>(row) * num_heads + head) * head_dim;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int d = lane + k * kWarpSize;
    qr[k] = d < head_dim ? load_float(q_row + d) * scale : 0.0f;
  }

  float m = -INFINITY;
  float l = 0.0f;
  float acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = 0.0f;

  for (int base = warp * kUnroll; base < n; base += kWarps * kUnroll) {
    int64_t off[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int pos = min(base + u, n - 1);  // past the end: a valid position, weighted 0 below
      const int64_t slot =
          static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
      off[u] = (slot * num_kv_heads + kv_head) * head_dim;
    }
    float kv[kUnroll][kPer];
    float vv[kUnroll][kPer];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int d = lane + k * kWarpSize;
        kv[u][k] = d < head_dim ? load_float(k_cache + off[u] + d) : 0.0f;
        vv[u][k] = d < head_dim ? load_float(v_cache + off[u] + d) : 0.0f;
      }
    }
    float score[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float partial = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) partial += qr[k] * kv[u][k];
      score[u] = partial;
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) score[u] += __shfl_xor_sync(0xffffffffu, score[u], offset);
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u < n) m_new = fmaxf(m_new, score[u]);
    }
    const float corr = expf(m - m_new);  // 0 while m is -inf (m_new is finite: base < n)
    l *= corr;
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[k] *= corr;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float p = base + u < n ? expf(score[u] - m_new) : 0.0f;
      l += p;
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] += p * vv[u][k];
    }
    m = m_new;
  }

  __shared__ float warp_m[kWarps];
  __shared__ float warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kPer * kWarpSize];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) warp_acc[warp][k * kWarpSize + lane] = acc[k];
  __syncthreads();

  if (warp == 0) {
    T* out_row = out + (static_cast<int64_t>(row) * num_heads + head) * head_dim;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < head_dim) {
        store_float(merge_warp_states(warp_m, warp_l, 1, &warp_acc[0][d], kPer * kWarpSize, kWarps),
                    out_row + d);
      }
    }
  }
}

// v4, the lane-per-position kernel: one thread block per (row, KV head[, pass]) for up to kG query
// heads of that KV head, kFlashWarps warps. Warp w takes 32 positions at a time (w * 32, then
// kFlashWarps * 32 further on), lane j the j-th of them:
//   scores  lane j reads its position's whole K row (16-byte loads) once and scores it against
//           every head's q (in shared memory, pre-scaled): no cross-lane sum per position;
//   softmax per head, the 32 scores' max and sum by warp reductions (once per 32 positions, not
//           once per position), the running (m, l, acc) rescaled; probabilities to shared memory;
//   values  the warp walks the 32 positions, lane l holding dims [l * kPer, l * kPer + kPer) of
//           every head's accumulator: each V row is read once (coalesced) for all kG heads.
// The warps' states are merged in warp order at the end. K and V are read once per KV head, and
// the instruction count per (position, head) is a few, not a few dozen. Each output depends only
// on its own row's data, in an order fixed by the row's context length: deterministic and
// batch-invariant. Needs head_dim = 32 * kPer with kPer in {1, 2, 4} (flash_fits).
constexpr int kFlashWarps = 8;
constexpr int kFlashThreads = kFlashWarps * kWarpSize;

// kPer consecutive elements of a row into floats (aligned: the row offset is a multiple of kPer).
template <int kPer>
__device__ __forceinline__ void load_run(const float* p, float* out) {
  if constexpr (kPer == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (kPer == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = *p;
  }
}

template <int kPer>
__device__ __forceinline__ void load_run(const __nv_bfloat16* p, float* out) {
  if constexpr (kPer == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 a = __bfloat1622float2(b[0]), c = __bfloat1622float2(b[1]);
    out[0] = a.x, out[1] = a.y, out[2] = c.x, out[3] = c.y;
  } else if constexpr (kPer == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    out[0] = a.x, out[1] = a.y;
  } else {
    out[0] = __bfloat162float(*p);
  }
}

// Eight consecutive elements (16 bytes of bfloat16, two 16-byte loads of float32).
__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z,
  out[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(b[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

template <typename T, int kG, int kPer>
__global__ void __launch_bounds__(kFlashThreads)
    paged_attention_flash_kernel(T* __restrict__ out, const T* __restrict__ q,
                                 const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                 const int32_t* __restrict__ query_start,
                                 const int32_t* __restrict__ context_lens,
                                 const int32_t* __restrict__ block_tables, int num_seqs,
                                 int num_heads, int num_kv_heads, int block_size, int max_blocks,
                                 float scale, int passes) {
  constexpr int kDim = kPer * kWarpSize;
  __shared__ __align__(16) float qs[kG][kDim];
  __shared__ float ps[kFlashWarps][kG][kWarpSize];
  __shared__ float wm[kFlashWarps][kG];
  __shared__ float wl[kFlashWarps][kG];
  __shared__ float wacc[kFlashWarps][kG][kDim];

  const int group = num_heads / num_kv_heads;
  // Blocks in (row, KV head, pass) order: the KV heads of one row run side by side.
  int64_t b = blockIdx.x;
  const int pass = static_cast<int>(b % passes);
  b /= passes;
  const int kv_head = static_cast<int>(b % num_kv_heads);
  const int row = static_cast<int>(b / num_kv_heads);
  const int g0 = pass * kG;
  const int gn = min(kG, group - g0);  // heads of this pass
  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;

  const RowContext ctx = row_context(query_start, context_lens, num_seqs, row);
  const int n = ctx.n;  // >= 1
  const int32_t* table = block_tables + static_cast<int64_t>(ctx.seq) * max_blocks;

  const int head0 = kv_head * group + g0;  // first query head of this block
  const T* q_row = q + (static_cast<int64_t>(row) * num_heads + head0) * kDim;
  for (int i = tid; i < kG * kDim; i += kFlashThreads) {
    qs[i / kDim][i % kDim] = i / kDim < gn ? load_float(q_row + i) * scale : 0.0f;
  }
  __syncthreads();

  float m[kG], l[kG], acc[kG][kPer];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[g][k] = 0.0f;
  }

  for (int c0 = warp * kWarpSize; c0 < n; c0 += kFlashWarps * kWarpSize) {
    const int pos = c0 + lane;
    const bool valid = pos < n;
    int64_t slot = 0;
    float s[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) s[g] = 0.0f;
    if (valid) {
      slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
      const T* k_row = k_cache + (slot * num_kv_heads + kv_head) * kDim;
#pragma unroll
      for (int c = 0; c < kDim / 8; ++c) {
        float kf[8];
        load8(k_row + c * 8, kf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float4 qa = *reinterpret_cast<const float4*>(&qs[g][c * 8]);
          const float4 qb = *reinterpret_cast<const float4*>(&qs[g][c * 8 + 4]);
          s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                  qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float cmax = valid ? s[g] : -INFINITY;
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, offset));
      }
      const float m_new = fmaxf(m[g], cmax);  // finite: lane 0's position is valid
      const float corr = expf(m[g] - m_new);  // 0 while m is -inf
      const float p = valid ? expf(s[g] - m_new) : 0.0f;
      l[g] = l[g] * corr + warp_sum(p);
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[g][k] *= corr;
      m[g] = m_new;
      ps[warp][g][lane] = p;
    }
    __syncwarp();
    const int cnt = min(kWarpSize, n - c0);
#pragma unroll 4
    for (int j = 0; j < cnt; ++j) {
      const int64_t slot_j = __shfl_sync(0xffffffffu, slot, j);
      float vf[kPer];
      load_run<kPer>(v_cache + (slot_j * num_kv_heads + kv_head) * kDim + lane * kPer, vf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float p = ps[warp][g][j];
#pragma unroll
        for (int k = 0; k < kPer; ++k) acc[g][k] += p * vf[k];
      }
    }
    __syncwarp();  // ps is rewritten by the next chunk
  }

#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) {
      wm[warp][g] = m[g];
      wl[warp][g] = l[g];
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) wacc[warp][g][lane * kPer + k] = acc[g][k];
  }
  __syncthreads();
  for (int i = tid; i < gn * kDim; i += kFlashThreads) {
    const int g = i / kDim, d = i % kDim;
    const float o =
        merge_warp_states(&wm[0][g], &wl[0][g], kG, &wacc[0][g][d], kG * kDim, kFlashWarps);
    store_float(o, out + (static_cast<int64_t>(row) * num_heads + head0 + g) * kDim + d);
  }
}

// Heads per pass of the flash kernel for a group size: the group when an instantiation has it,
// else the next one up (masked heads cost their arithmetic), 8 at most (more take passes).
int flash_heads_per_pass(int group) {
  if (group <= 2) return group;
  if (group <= 4) return 4;
  if (group == 7) return 7;
  return 8;
}

// v4 loads 16 bytes at a time from the caches: their storage must start 16-byte aligned (the
// engine's pool slices always do; a view at an odd offset runs v2).
bool flash_fits(int head_dim, const void* k_cache, const void* v_cache) {
  const bool aligned = reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  return aligned && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

template <typename T, int kG, int kPer>
void launch_flash_g(T* out, const T* q, const T* k_cache, const T* v_cache,
                    const PagedAttentionMetadata& meta, int rows, int num_heads, int num_kv_heads,
                    int block_size, float scale, cudaStream_t stream) {
  const int passes = (num_heads / num_kv_heads + kG - 1) / kG;
  const int64_t blocks = static_cast<int64_t>(rows) * num_kv_heads * passes;
  if (blocks > 0x7fffffff)
    throw std::invalid_argument("paged_attention: too many rows for one launch");
  paged_attention_flash_kernel<T, kG, kPer>
      <<<static_cast<unsigned>(blocks), kFlashThreads, 0, stream>>>(
          out, q, k_cache, v_cache, meta.query_start.data_ptr<int32_t>(),
          meta.context_lens.data_ptr<int32_t>(), meta.block_tables.data_ptr<int32_t>(),
          static_cast<int>(meta.context_lens.size(0)), num_heads, num_kv_heads, block_size,
          static_cast<int>(meta.block_tables.size(1)), scale, passes);
}

template <typename T, int kPer>
void launch_flash(T* out, const T* q, const T* k_cache, const T* v_cache,
                  const PagedAttentionMetadata& meta, int rows, int num_heads, int num_kv_heads,
                  int block_size, float scale, cudaStream_t stream) {
  switch (flash_heads_per_pass(num_heads / num_kv_heads)) {
    case 1:
      return launch_flash_g<T, 1, kPer>(out, q, k_cache, v_cache, meta, rows, num_heads,
                                        num_kv_heads, block_size, scale, stream);
    case 2:
      return launch_flash_g<T, 2, kPer>(out, q, k_cache, v_cache, meta, rows, num_heads,
                                        num_kv_heads, block_size, scale, stream);
    case 4:
      return launch_flash_g<T, 4, kPer>(out, q, k_cache, v_cache, meta, rows, num_heads,
                                        num_kv_heads, block_size, scale, stream);
    case 7:
      return launch_flash_g<T, 7, kPer>(out, q, k_cache, v_cache, meta, rows, num_heads,
                                        num_kv_heads, block_size, scale, stream);
    default:
      return launch_flash_g<T, 8, kPer>(out, q, k_cache, v_cache, meta, rows, num_heads,
                                        num_kv_heads, block_size, scale, stream);
  }
}

// One thread block per token: copies its k and v rows ([num_kv_heads * head_dim]) into its slot.
template <typename T>
__global__ void write_kv_cache_kernel(T* __restrict__ k_cache, T* __restrict__ v_cache,
                                      const T* __restrict__ k, const T* __restrict__ v,
                                      const int64_t* __restrict__ slot_mapping, int64_t row_elems,
                                      int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;  // unchecked on the GPU: never write out of bounds
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    k_cache[slot * row_elems + i] = k[t * row_elems + i];
    v_cache[slot * row_elems + i] = v[t * row_elems + i];
  }
}

template <typename T, int kPer>
void launch_unrolled(T* out, const T* q, const T* k_cache, const T* v_cache,
                     const PagedAttentionMetadata& meta, const dim3& grid, int num_heads,
                     int num_kv_heads, int head_dim, int block_size, float scale,
                     cudaStream_t stream) {
  paged_attention_unrolled_kernel<T, kPer><<<grid, kThreads, 0, stream>>>(
      out, q, k_cache, v_cache, meta.query_start.data_ptr<int32_t>(),
      meta.context_lens.data_ptr<int32_t>(), meta.block_tables.data_ptr<int32_t>(),
      static_cast<int>(meta.context_lens.size(0)), num_heads, num_kv_heads, head_dim, block_size,
      static_cast<int>(meta.block_tables.size(1)), scale);
}

template <typename T, typename AtT>
void launch_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                      const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                      cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(q.size(0)), static_cast<unsigned>(q.size(1)));
  T* o = reinterpret_cast<T*>(out.data_ptr<AtT>());
  const T* qp = reinterpret_cast<const T*>(q.data_ptr<AtT>());
  const T* kp = reinterpret_cast<const T*>(k_cache.data_ptr<AtT>());
  const T* vp = reinterpret_cast<const T*>(v_cache.data_ptr<AtT>());
  const int rows = static_cast<int>(q.size(0));
  const int heads = static_cast<int>(q.size(1)), kv_heads = static_cast<int>(k_cache.size(2));
  const int head_dim = static_cast<int>(q.size(2)), bs = static_cast<int>(k_cache.size(1));
  const int per = (head_dim + kWarpSize - 1) / kWarpSize;
  CudaAttentionKernel kernel = cuda_attention_kernel();
#ifdef CRL_WITH_FLASHINFER
  // auto takes FlashInfer's decode where it fits: on an H200 it made the rollout benchmark on
  // Qwen3-0.6B's shape (GQA group 2, head_dim 128) 1.29x faster end to end than v4 (14,019 against
  // 10,828 output tok/s) before split-KV. Qwen2-0.5B's group of 7 runs as 8 with a zero head.
  if (kernel == CudaAttentionKernel::kFlashInfer || kernel == CudaAttentionKernel::kAuto) {
    if (flashinfer_decode_fits(q, k_cache, meta)) {
      flashinfer_decode(out, q, k_cache, v_cache, meta, scale, stream);
      return;
    }
    if (flashinfer_prefill(out, q, k_cache, v_cache, meta, scale, stream)) return;
    if (kernel == CudaAttentionKernel::kFlashInfer) kernel = CudaAttentionKernel::kFlash;
    // prefill, float32, other group sizes: v4 where it fits (below)
  }
#endif
  if (kernel == CudaAttentionKernel::kAuto || kernel == CudaAttentionKernel::kFlashInfer) {
    // v4 where head_dim allows it: on an H100 it made the nano-vllm rollout benchmark (Qwen2-0.5B
    // shape, G = 7) 2.2x faster end to end than v2 (5.85 s against 12.98 s; decode attention 60 us
    // against 178 us a layer at 256 sequences, prefill 537 us against 2,160 us). v2 elsewhere.
    kernel =
        flash_fits(head_dim, kp, vp) ? CudaAttentionKernel::kFlash : CudaAttentionKernel::kUnrolled;
  }
  if (kernel == CudaAttentionKernel::kFlash && flash_fits(head_dim, kp, vp)) {
    if (head_dim == 32) {
      launch_flash<T, 1>(o, qp, kp, vp, meta, rows, heads, kv_heads, bs, scale, stream);
    } else if (head_dim == 64) {
      launch_flash<T, 2>(o, qp, kp, vp, meta, rows, heads, kv_heads, bs, scale, stream);
    } else {
      launch_flash<T, 4>(o, qp, kp, vp, meta, rows, heads, kv_heads, bs, scale, stream);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // v2, and v4 where it does not fit.
  if (per <= 1) {
    launch_unrolled<T, 1>(o, qp, kp, vp, meta, grid, heads, kv_heads, head_dim, bs, scale, stream);
  } else if (per <= 2) {
    launch_unrolled<T, 2>(o, qp, kp, vp, meta, grid, heads, kv_heads, head_dim, bs, scale, stream);
  } else if (per <= 4) {
    launch_unrolled<T, 4>(o, qp, kp, vp, meta, grid, heads, kv_heads, head_dim, bs, scale, stream);
  } else {
    launch_unrolled<T, kMaxPerLane>(o, qp, kp, vp, meta, grid, heads, kv_heads, head_dim, bs, scale,
                                    stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename AtT>
void launch_write(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& slot_mapping, cudaStream_t stream) {
  const int64_t row_elems = k.size(1) * k.size(2);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  write_kv_cache_kernel<T><<<static_cast<unsigned>(k.size(0)), kThreads, 0, stream>>>(
      reinterpret_cast<T*>(k_cache.data_ptr<AtT>()), reinterpret_cast<T*>(v_cache.data_ptr<AtT>()),
      reinterpret_cast<const T*>(k.data_ptr<AtT>()), reinterpret_cast<const T*>(v.data_ptr<AtT>()),
      slot_mapping.data_ptr<int64_t>(), row_elems, num_slots);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor paged_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                                double scale) {
  if (q.size(2) > kMaxPerLane * kWarpSize) {
    throw std::invalid_argument("paged_attention: head_dim " + std::to_string(q.size(2)) +
                                " exceeds the CUDA kernel's limit of " +
                                std::to_string(kMaxPerLane * kWarpSize));
  }
  if (q.size(1) > 65535) {
    throw std::invalid_argument("paged_attention: num_heads " + std::to_string(q.size(1)) +
                                " exceeds the CUDA grid limit of 65535");
  }
  const c10::cuda::CUDAGuard device_guard(q.device());
  at::Tensor out = at::empty_like(q);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (q.scalar_type() == at::kBFloat16) {
    launch_attention<__nv_bfloat16, at::BFloat16>(out, q, k_cache, v_cache, meta,
                                                  static_cast<float>(scale), stream);
  } else {
    launch_attention<float, float>(out, q, k_cache, v_cache, meta, static_cast<float>(scale),
                                   stream);
  }
  return out;
}

void write_kv_cache_cuda(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& slot_mapping) {
  const c10::cuda::CUDAGuard device_guard(k_cache.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (k_cache.scalar_type() == at::kBFloat16) {
    launch_write<__nv_bfloat16, at::BFloat16>(k_cache, v_cache, k, v, slot_mapping, stream);
  } else {
    launch_write<float, float>(k_cache, v_cache, k, v, slot_mapping, stream);
  }
}

}  // namespace crl::kv::detail

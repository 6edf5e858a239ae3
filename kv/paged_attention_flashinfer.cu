// FlashInfer's batch decode attention (flashinfer-python's headers, compiled by the GPU build
// path) over the project's paged KV cache, in its NHD layout as it is ([num_blocks, block_size,
// num_kv_heads, head_dim], a page per block).
//
// Work split (split-KV). A block per (sequence, KV head) leaves most of an H200 idle at Qwen2's two
// KV heads (512 blocks at 256 sequences) and ends a step on its longest context. So each
// sequence's context is cut into chunks of one size (whole pages, at least 128 positions), chosen
// per step as the smallest that keeps the work items within `waves` times what the GPU holds at
// once (FlashInfer's own planner's rule, its binary search); each item attends over its chunk, and
// FlashInfer's merge kernel combines a sequence's chunks by their log-sum-exp. The grid is padded
// to that bound (items past the step's are masked off), so a CUDA graph captured once replays any
// step. The plan (page arrays, items, chunk size) is computed on the device by one small kernel
// from the block tables and context lengths, once a step (the first layer's call; the others reuse
// it through PagedAttentionMetadata::step_plan): nothing is read back. `waves` is
// kv::flashinfer_split_waves() (CRL_FLASHINFER_WAVES; 0: no split, a block per sequence and KV
// head, batch-invariant as v4 is).
//
// Covers decode batches (one query row a sequence) in bfloat16 with head_dim 64 or 128 and a GQA
// group of at most 8. FlashInfer's decode dispatch has groups 1, 2, 3, 4 and 8; the others (5, 6,
// Qwen2-0.5B's 7) run as 8 with zero query heads padded in (one copy in, one out: the KV is read
// once either way). flashinfer_decode_fits says what is covered; the caller runs the project's
// own kernel otherwise (prefill, float32, groups above 8).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

#include <cstdlib>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <flashinfer/attention/cascade.cuh>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kv/paged_attention_flashinfer.h"
#include "kv/paged_attention_flashinfer_prefill.cuh"

namespace crl::kv::detail {

namespace {

using T = __nv_bfloat16;
using Params = flashinfer::BatchDecodeParams<T, T, T, int32_t>;
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                             /*logits_soft_cap=*/false, /*alibi=*/false>;

constexpr int kPlanThreads = 1024;
constexpr int kMinChunkPositions = 128;  // FlashInfer's planner's floor for a chunk

// The group FlashInfer's decode kernel runs for a model's group (0: none).
int padded_group(int64_t g) {
  if (g == 1 || g == 2 || g == 3 || g == 4) return static_cast<int>(g);
  return g >= 5 && g <= 8 ? 8 : 0;
}

// The work split a step's decode calls share. `work` holds, in int32:
// [indptr S+1 | last_page_len S | o_indptr S+1 | chunk 1 | request_indices P | kv_tile_indices P |
//  valid P (bytes, rounded up to int32) | indices S*B]
struct StepPlan {
  int64_t seqs = 0, padded = 0, block_size = 0, num_kv_heads = 0, group = 0, head_dim = 0;
  bool split = false;
  bool prefill = false;  // a prefill plan (below) rather than a decode split
  bool prefill_ok = false;
  FlashInferPrefillLaunch launch;  // prefill: the plan's part of the launch
  at::Tensor int_ws, float_ws;     // prefill: FlashInfer's workspaces
  at::Tensor work;
  at::Tensor tmp_v;  // split: [P, num_kv_heads * group, head_dim] partial outputs
  at::Tensor tmp_s;  // split: [P, num_kv_heads * group] their log-sum-exps
  int32_t *indptr, *last_page_len, *o_indptr, *chunk, *request_indices, *kv_tile_indices, *indices;
  bool* valid;
};

// The per-step plan, one block: the page arrays of FlashInfer's paged_kv_t from the block tables
// (indptr[s + 1] - indptr[s] pages of sequence s, listed from indices[indptr[s]], the last holding
// last_page_len[s] positions); then, with `split`, the smallest chunk of whole pages (at least
// min_chunk_pages) that cuts the sequences into at most `padded` items, and the items in sequence
// order (request_indices, kv_tile_indices; o_indptr[s]: sequence s's first item); items past the
// last are masked off (valid). Without `split`, item s is sequence s whole.
__global__ void __launch_bounds__(kPlanThreads)
    plan_decode(const int32_t* __restrict__ block_tables, const int32_t* __restrict__ context_lens,
                int seqs, int max_blocks, int block_size, int padded, int min_chunk_pages,
                bool split, int32_t* __restrict__ indptr, int32_t* __restrict__ last_page_len,
                int32_t* __restrict__ o_indptr, int32_t* __restrict__ chunk,
                int32_t* __restrict__ request_indices, int32_t* __restrict__ kv_tile_indices,
                bool* __restrict__ valid, int32_t* __restrict__ indices) {
  using Scan = cub::BlockScan<int32_t, kPlanThreads>;
  using Reduce = cub::BlockReduce<int32_t, kPlanThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } storage;
  __shared__ int32_t carry, shared_value, chunk_pages;
  const int tid = static_cast<int>(threadIdx.x);
  auto pages_of = [&](int s) {
    return s < seqs ? max(1, (context_lens[s] + block_size - 1) / block_size) : 0;
  };

  // Page arrays and the longest sequence's pages.
  if (tid == 0) carry = 0, indptr[0] = 0;
  int32_t longest = 0;
  for (int base = 0; base < seqs; base += kPlanThreads) {
    const int s = base + tid;
    const int32_t pages = pages_of(s);
    if (s < seqs) last_page_len[s] = context_lens[s] - (pages - 1) * block_size;
    longest = max(longest, pages);
    int32_t inclusive = 0, total = 0;
    __syncthreads();
    Scan(storage.scan).InclusiveSum(pages, inclusive, total);
    if (s < seqs) indptr[s + 1] = carry + inclusive;
    __syncthreads();
    if (tid == 0) carry += total;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, offset));
  }
  if (tid == 0) shared_value = 0;
  __syncthreads();
  if (tid % 32 == 0) atomicMax(&shared_value, longest);
  __syncthreads();

  // The chunk: the smallest c in [min_chunk_pages, longest] with sum ceil(pages / c) <= padded
  // (c = longest gives one item a sequence, and padded >= seqs).
  if (split) {
    int32_t lo = min(min_chunk_pages, shared_value), hi = shared_value;
    while (lo < hi) {  // uniform across the block: every thread holds the same lo, hi
      const int32_t mid = (lo + hi) / 2;
      int32_t items = 0;
      for (int s = tid; s < seqs; s += kPlanThreads) items += (pages_of(s) + mid - 1) / mid;
      __syncthreads();
      const int32_t sum = Reduce(storage.reduce).Sum(items);
      if (tid == 0) shared_value = sum;
      __syncthreads();
      if (shared_value > padded) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
      __syncthreads();
    }
    if (tid == 0) chunk_pages = lo;
  } else if (tid == 0) {
    chunk_pages = max(shared_value, 1);
  }
  __syncthreads();
  const int32_t c = chunk_pages;
  if (tid == 0) *chunk = c * block_size, carry = 0, o_indptr[0] = 0;

  // The items, sequence by sequence.
  for (int base = 0; base < seqs; base += kPlanThreads) {
    const int s = base + tid;
    const int32_t n = s < seqs ? (pages_of(s) + c - 1) / c : 0;
    int32_t inclusive = 0, total = 0;
    __syncthreads();
    Scan(storage.scan).InclusiveSum(n, inclusive, total);
    if (s < seqs) {
      const int32_t first = carry + inclusive - n;
      o_indptr[s + 1] = first + n;
      for (int32_t j = 0; j < n; ++j) {
        request_indices[first + j] = s;
        kv_tile_indices[first + j] = j;
        valid[first + j] = true;
      }
    }
    __syncthreads();
    if (tid == 0) carry += total;
  }
  __syncthreads();
  for (int i = carry + tid; i < padded; i += kPlanThreads) {
    request_indices[i] = 0;  // read before the mask
    kv_tile_indices[i] = 0;
    valid[i] = false;
  }

  // The page indices: a warp a sequence copies its block-table row.
  const int warp = tid / 32, lane = tid % 32;
  for (int s = warp; s < seqs; s += kPlanThreads / 32) {
    const int32_t start = indptr[s], n = indptr[s + 1] - start;
    for (int j = lane; j < n; j += 32) {
      indices[start + j] = block_tables[static_cast<int64_t>(s) * max_blocks + j];
    }
  }
}

// Copies heads between [S, kv_heads * from_group, D] rows (src; row stride src_row, in elements)
// and [S, kv_heads * to_group, D] (dst, contiguous): each KV head's first min(groups) heads, 16
// bytes a thread; dst heads past the source group are zeroed.
__global__ void regroup_heads(const T* __restrict__ src, int64_t src_row, int64_t src_head,
                              T* __restrict__ dst, int seqs, int kv_heads, int from_group,
                              int to_group, int head_dim) {
  const int vecs = head_dim / 8;
  const int64_t total = static_cast<int64_t>(seqs) * kv_heads * to_group * vecs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i % vecs);
    int64_t r = i / vecs;
    const int g = static_cast<int>(r % to_group);
    r /= to_group;
    const int kv = static_cast<int>(r % kv_heads);
    const int64_t s = r / kv_heads;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (g < from_group) {
      value = *reinterpret_cast<const uint4*>(src + s * src_row + (kv * from_group + g) * src_head +
                                              v * 8);
    }
    *reinterpret_cast<uint4*>(dst + i * 8) = value;
  }
}

void launch_regroup(const T* src, int64_t src_row, int64_t src_head, T* dst, int64_t seqs,
                    int64_t kv_heads, int64_t from_group, int64_t to_group, int64_t head_dim,
                    cudaStream_t stream) {
  const int64_t total = seqs * kv_heads * to_group * (head_dim / 8);
  const int threads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 4096));
  regroup_heads<<<blocks, threads, 0, stream>>>(
      src, src_row, src_head, dst, static_cast<int>(seqs), static_cast<int>(kv_heads),
      static_cast<int>(from_group), static_cast<int>(to_group), static_cast<int>(head_dim));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Thread blocks of FlashInfer's decode kernel the device holds at once (its occupancy times the
// SMs), from FlashInfer's own work estimation; cached per device, group and head_dim.
template <uint32_t kHeadDim, uint32_t kGroup>
uint32_t resident_blocks(uint32_t num_kv_heads, uint32_t block_size) {
  bool split = false;
  uint32_t max_grid = 0, max_pages = 0, new_batch = 0, gdy = 0;
  int32_t indptr_h[2] = {0, 1};
  const cudaError_t err = flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
      kGroup, kHeadDim, flashinfer::PosEncodingMode::kNone, Variant, Params>(
      split, max_grid, max_pages, new_batch, gdy, /*batch_size=*/1, indptr_h, num_kv_heads * kGroup,
      block_size, /*enable_cuda_graph=*/true, nullptr);
  if (err != cudaSuccess || max_grid == 0) {
    throw std::runtime_error(std::string("paged_attention: FlashInfer work estimation failed: ") +
                             cudaGetErrorString(err));
  }
  return max_grid;
}

template <uint32_t kHeadDim>
uint32_t resident_blocks_for(int group, uint32_t num_kv_heads, uint32_t block_size) {
  switch (group) {
    case 1:
      return resident_blocks<kHeadDim, 1>(num_kv_heads, block_size);
    case 2:
      return resident_blocks<kHeadDim, 2>(num_kv_heads, block_size);
    case 3:
      return resident_blocks<kHeadDim, 3>(num_kv_heads, block_size);
    case 4:
      return resident_blocks<kHeadDim, 4>(num_kv_heads, block_size);
    default:
      return resident_blocks<kHeadDim, 8>(num_kv_heads, block_size);
  }
}

int64_t cached_resident_blocks(int device, int group, int64_t head_dim, int64_t num_kv_heads,
                               int64_t block_size) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int64_t>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, group, head_dim);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const uint32_t kvh = static_cast<uint32_t>(num_kv_heads), bs = static_cast<uint32_t>(block_size);
  const int64_t blocks = head_dim == 64 ? resident_blocks_for<64>(group, kvh, bs)
                                        : resident_blocks_for<128>(group, kvh, bs);
  cache.emplace(key, blocks);
  return blocks;
}

// FlashInfer's prefill plan on the host (PrefillPlan: query tiles, KV chunks and their merge,
// copied into the int workspace on `stream`), from the step's query offsets and context lengths
// read back from the device: one synchronization a prefill step (those are not graph-captured).
// Leaves p.prefill_ok false where the step has a sequence with no query rows (the project's own
// kernel takes it).
void plan_prefill(const at::Tensor& q, const PagedAttentionMetadata& meta, StepPlan& p,
                  cudaStream_t stream) {
  const at::Tensor qs = meta.query_start.to(at::kCPU), cl = meta.context_lens.to(at::kCPU);
  const int32_t* qs_h = qs.data_ptr<int32_t>();
  const int32_t* cl_h = cl.data_ptr<int32_t>();
  const int64_t seqs = p.seqs;
  std::vector<int32_t> kv_indptr(static_cast<size_t>(seqs) + 1, 0);
  for (int64_t s = 0; s < seqs; ++s) {
    if (qs_h[s + 1] <= qs_h[s] || cl_h[s] < qs_h[s + 1] - qs_h[s]) return;
    const int32_t pages =
        std::max<int32_t>(1, static_cast<int32_t>((cl_h[s] + p.block_size - 1) / p.block_size));
    kv_indptr[static_cast<size_t>(s) + 1] = kv_indptr[static_cast<size_t>(s)] + pages;
  }
  std::vector<int32_t> qo_indptr(qs_h, qs_h + seqs + 1);
  const int64_t rows = qs_h[seqs];
  const int64_t num_qo_heads = q.size(1), group = num_qo_heads / p.num_kv_heads;
  const int num_sm = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  // Bounds of what PrefillPlan allocates: three index arrays over the work items (at most a tile
  // of 16 packed rows each, plus one a sequence), o_indptr, the merge indptr; and, split, the
  // partial outputs of at most 2 x SMs / KV heads items of 128 rows.
  const int64_t items = rows * group / 16 + 2 * seqs + 2 * num_sm + 64;
  const int64_t int_bytes = 4 * (4 * items + 2 * seqs + rows + 16) + 1024;
  const int64_t split_items = std::max<int64_t>(1, 2 * num_sm / p.num_kv_heads);
  const int64_t float_bytes = num_qo_heads * split_items * 128 * (p.head_dim + 1) * 4 + 1024;
  p.int_ws = at::empty({int_bytes}, at::TensorOptions().dtype(at::kByte).device(q.device()));
  p.float_ws = at::empty({float_bytes}, at::TensorOptions().dtype(at::kByte).device(q.device()));
  std::vector<uint8_t> host(static_cast<size_t>(int_bytes));  // pageable: the copy is staged
  flashinfer::PrefillPlanInfo info;
  const cudaError_t err = flashinfer::PrefillPlan<int32_t>(
      p.float_ws.data_ptr(), static_cast<size_t>(float_bytes), p.int_ws.data_ptr(), host.data(),
      static_cast<size_t>(int_bytes), info, qo_indptr.data(), kv_indptr.data(),
      static_cast<uint32_t>(rows), static_cast<uint32_t>(seqs), static_cast<uint32_t>(num_qo_heads),
      static_cast<uint32_t>(p.num_kv_heads), static_cast<uint32_t>(p.head_dim),
      static_cast<uint32_t>(p.head_dim), static_cast<uint32_t>(p.block_size),
      /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2,
      /*window_left=*/-1, /*fixed_split_size=*/-1, /*disable_split_kv=*/false,
      /*num_colocated_ctas=*/0, stream);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("paged_attention: FlashInfer prefill plan failed: ") +
                             cudaGetErrorString(err));
  }
  FlashInferPrefillLaunch& l = p.launch;
  l.int_workspace = p.int_ws.data_ptr();
  l.float_workspace = p.float_ws.data_ptr();
  l.cta_tile_q = info.cta_tile_q, l.padded_batch_size = info.padded_batch_size;
  l.total_num_rows = info.total_num_rows;
  l.request_indices_offset = info.request_indices_offset;
  l.qo_tile_indices_offset = info.qo_tile_indices_offset;
  l.kv_tile_indices_offset = info.kv_tile_indices_offset;
  l.o_indptr_offset = info.o_indptr_offset;
  l.kv_chunk_size_ptr_offset = info.kv_chunk_size_ptr_offset;
  l.merge_indptr_offset = info.merge_indptr_offset;
  l.v_offset = info.v_offset, l.s_offset = info.s_offset;
  l.split_kv = info.split_kv;
  p.prefill_ok = true;
}

// The step's plan: the one `meta` holds when it was built for this call's shape, else a new one
// (kept in meta.step_plan for the next layers).
StepPlan& plan_for(const at::Tensor& q, const at::Tensor& k_cache,
                   const PagedAttentionMetadata& meta, int group, bool prefill,
                   cudaStream_t stream) {
  const int64_t seqs = prefill ? meta.context_lens.size(0) : q.size(0), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(2), block_size = k_cache.size(1);
  if (auto* p = static_cast<StepPlan*>(meta.step_plan.get());
      p != nullptr && p->prefill == prefill && p->seqs == seqs && p->block_size == block_size &&
      p->num_kv_heads == num_kv_heads && p->group == group && p->head_dim == head_dim) {
    return *p;
  }
  auto plan = std::make_shared<StepPlan>();
  StepPlan& p = *plan;
  p.seqs = seqs, p.block_size = block_size, p.num_kv_heads = num_kv_heads, p.group = group,
  p.head_dim = head_dim, p.prefill = prefill;
  const int64_t waves = prefill ? 0 : flashinfer_split_waves();
  p.split = waves > 0;
  p.padded = seqs;
  if (p.split) {
    const int64_t resident =
        cached_resident_blocks(q.get_device(), group, head_dim, num_kv_heads, block_size);
    p.padded = std::max<int64_t>(seqs, waves * resident / num_kv_heads);
  }
  const int64_t max_blocks = meta.block_tables.size(1);
  const int64_t valid_words = (p.padded + 3) / 4;
  p.work = at::empty({3 * seqs + 3 + 2 * p.padded + valid_words + seqs * max_blocks},
                     at::TensorOptions().dtype(at::kInt).device(q.device()));
  p.indptr = p.work.data_ptr<int32_t>();
  p.last_page_len = p.indptr + seqs + 1;
  p.o_indptr = p.last_page_len + seqs;
  p.chunk = p.o_indptr + seqs + 1;
  p.request_indices = p.chunk + 1;
  p.kv_tile_indices = p.request_indices + p.padded;
  p.valid = reinterpret_cast<bool*>(p.kv_tile_indices + p.padded);
  p.indices = p.kv_tile_indices + p.padded + valid_words;
  if (p.split) {
    p.tmp_v = at::empty({p.padded, num_kv_heads * group, head_dim}, q.options());
    p.tmp_s = at::empty({p.padded, num_kv_heads * group},
                        at::TensorOptions().dtype(at::kFloat).device(q.device()));
  }
  const int min_chunk_pages =
      static_cast<int>(std::max<int64_t>(1, (kMinChunkPositions + block_size - 1) / block_size));
  plan_decode<<<1, kPlanThreads, 0, stream>>>(
      meta.block_tables.data_ptr<int32_t>(), meta.context_lens.data_ptr<int32_t>(),
      static_cast<int>(seqs), static_cast<int>(max_blocks), static_cast<int>(block_size),
      static_cast<int>(p.padded), min_chunk_pages, p.split, p.indptr, p.last_page_len, p.o_indptr,
      p.chunk, p.request_indices, p.kv_tile_indices, p.valid, p.indices);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (prefill) plan_prefill(q, meta, p, stream);
  meta.step_plan = plan;
  return p;
}

template <uint32_t kHeadDim>
void launch_decode(T* out, const T* q, int64_t q_stride_n, int64_t q_stride_h,
                   const at::Tensor& k_cache, const at::Tensor& v_cache, StepPlan& p, float scale,
                   cudaStream_t stream) {
  const auto seqs = static_cast<uint32_t>(p.seqs);
  const auto num_kv_heads = static_cast<uint32_t>(p.num_kv_heads);
  const auto num_heads = static_cast<uint32_t>(p.num_kv_heads * p.group);
  flashinfer::paged_kv_t<T, int32_t> paged_kv(
      num_kv_heads, static_cast<uint32_t>(p.block_size), kHeadDim, seqs,
      flashinfer::QKVLayout::kNHD, reinterpret_cast<T*>(k_cache.data_ptr<at::BFloat16>()),
      reinterpret_cast<T*>(v_cache.data_ptr<at::BFloat16>()), p.indices, p.indptr, p.last_page_len);
  Params params(const_cast<T*>(q), /*q_rope_offset=*/nullptr, paged_kv, out, /*lse=*/nullptr,
                /*maybe_alibi_slopes=*/nullptr, num_heads, static_cast<int32_t>(q_stride_n),
                static_cast<int32_t>(q_stride_h), /*window_left=*/-1, /*logits_soft_cap=*/0.f,
                scale, /*rope_scale=*/1.f, /*rope_theta=*/1e4f);
  params.request_indices = p.request_indices;
  params.kv_tile_indices = p.kv_tile_indices;
  params.o_indptr = p.o_indptr;
  params.kv_chunk_size_ptr = p.chunk;
  params.block_valid_mask = p.split ? p.valid : nullptr;
  params.padded_batch_size = static_cast<uint32_t>(p.padded);
  T* tmp_v = p.split ? reinterpret_cast<T*>(p.tmp_v.data_ptr<at::BFloat16>()) : nullptr;
  float* tmp_s = p.split ? p.tmp_s.data_ptr<float>() : nullptr;
  const cudaError_t err = flashinfer::BatchDecodeWithPagedKVCacheDispatched<
      kHeadDim, flashinfer::PosEncodingMode::kNone, Variant>(params, tmp_v, tmp_s,
                                                             /*enable_pdl=*/false, stream);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("paged_attention: FlashInfer batch decode failed: ") +
                             cudaGetErrorString(err));
  }
}

// Whether q's head rows start 16-byte aligned (FlashInfer and regroup_heads load 16 bytes).
bool rows_aligned(const at::Tensor& q) {
  return reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 && q.stride(0) % 8 == 0 &&
         q.stride(1) % 8 == 0;
}

}  // namespace

bool flashinfer_decode_fits(const at::Tensor& q, const at::Tensor& k_cache,
                            const PagedAttentionMetadata& meta) {
  const int64_t head_dim = q.size(2);
  const bool aligned = rows_aligned(q);
  return q.scalar_type() == at::kBFloat16 && meta.max_query_len == 1 &&
         q.size(0) == meta.context_lens.size(0) && (head_dim == 64 || head_dim == 128) &&
         q.size(1) % k_cache.size(2) == 0 && padded_group(q.size(1) / k_cache.size(2)) > 0 &&
         q.stride(2) == 1 && aligned && k_cache.is_contiguous();
}

void flashinfer_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                       cudaStream_t stream) {
  TORCH_CHECK(out.is_contiguous(), "paged_attention: FlashInfer writes a contiguous output");
  const int64_t seqs = q.size(0), head_dim = q.size(2), kv_heads = k_cache.size(2);
  const int64_t group = q.size(1) / kv_heads;
  const int run_group = padded_group(group);
  StepPlan& p = plan_for(q, k_cache, meta, run_group, /*prefill=*/false, stream);
  const T* qp = reinterpret_cast<const T*>(q.data_ptr<at::BFloat16>());
  T* op = reinterpret_cast<T*>(out.data_ptr<at::BFloat16>());
  int64_t q_stride_n = q.stride(0), q_stride_h = q.stride(1);
  at::Tensor q_run, out_run;
  if (run_group != group) {  // zero heads padded in, taken out again after
    q_run = at::empty({seqs, kv_heads * run_group, head_dim}, q.options());
    out_run = at::empty_like(q_run);
    launch_regroup(qp, q.stride(0), q.stride(1),
                   reinterpret_cast<T*>(q_run.data_ptr<at::BFloat16>()), seqs, kv_heads, group,
                   run_group, head_dim, stream);
    qp = reinterpret_cast<const T*>(q_run.data_ptr<at::BFloat16>());
    op = reinterpret_cast<T*>(out_run.data_ptr<at::BFloat16>());
    q_stride_n = kv_heads * run_group * head_dim, q_stride_h = head_dim;
  }
  if (head_dim == 64) {
    launch_decode<64>(op, qp, q_stride_n, q_stride_h, k_cache, v_cache, p, scale, stream);
  } else {
    launch_decode<128>(op, qp, q_stride_n, q_stride_h, k_cache, v_cache, p, scale, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (run_group != group) {
    launch_regroup(op, kv_heads * run_group * head_dim, head_dim,
                   reinterpret_cast<T*>(out.data_ptr<at::BFloat16>()), seqs, kv_heads, run_group,
                   group, head_dim, stream);
  }
}

bool flashinfer_prefill(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                        cudaStream_t stream) {
  const int64_t head_dim = q.size(2);
  const bool aligned = rows_aligned(q);
  if (q.scalar_type() != at::kBFloat16 || (head_dim != 64 && head_dim != 128) ||
      q.size(1) % k_cache.size(2) != 0 || q.stride(2) != 1 || !aligned ||
      !k_cache.is_contiguous() || !out.is_contiguous() || meta.context_lens.size(0) == 0) {
    return false;
  }
  static const bool enabled = [] {  // CRL_FLASHINFER_PREFILL=0: v4 instead (benchmarks compare)
    const char* e = std::getenv("CRL_FLASHINFER_PREFILL");
    return e == nullptr || std::string(e) != "0";
  }();
  if (!enabled) return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone) {
    return false;  // its plan reads the step's lengths back
  }
  const int group = static_cast<int>(q.size(1) / k_cache.size(2));
  StepPlan& p = plan_for(q, k_cache, meta, group, /*prefill=*/true, stream);
  if (!p.prefill_ok) return false;
  FlashInferPrefillLaunch l = p.launch;
  l.q = reinterpret_cast<const T*>(q.data_ptr<at::BFloat16>());
  l.q_stride_n = q.stride(0), l.q_stride_h = q.stride(1);
  l.k_cache = reinterpret_cast<T*>(k_cache.data_ptr<at::BFloat16>());
  l.v_cache = reinterpret_cast<T*>(v_cache.data_ptr<at::BFloat16>());
  l.out = reinterpret_cast<T*>(out.data_ptr<at::BFloat16>());
  l.seqs = static_cast<uint32_t>(p.seqs);
  l.num_qo_heads = static_cast<uint32_t>(q.size(1));
  l.num_kv_heads = static_cast<uint32_t>(p.num_kv_heads);
  l.block_size = static_cast<uint32_t>(p.block_size);
  l.q_indptr = meta.query_start.data_ptr<int32_t>();
  l.kv_indptr = p.indptr, l.kv_indices = p.indices, l.kv_last_page_len = p.last_page_len;
  l.scale = scale;
  l.stream = stream;
  const cudaError_t err = head_dim == 64 ? flashinfer_prefill_hd64(l) : flashinfer_prefill_hd128(l);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("paged_attention: FlashInfer batch prefill failed: ") +
                             cudaGetErrorString(err));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace crl::kv::detail

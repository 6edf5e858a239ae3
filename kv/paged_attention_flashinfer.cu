// FlashInfer's batch decode attention (flashinfer-python's headers, compiled by the GPU build
// path) over the project's paged KV cache: one thread block per (sequence, KV head), each
// sequence's whole context in that block (no split-KV, so no plan on the host and nothing that
// depends on the batch's other rows: batch-invariant, and the launch is CUDA-graph safe). The cache
// is FlashInfer's NHD layout as it is ([num_blocks, block_size, num_kv_heads, head_dim], a page
// per block); what FlashInfer needs beside it (page indptr, compacted page indices, last-page
// lengths) is built on the device from the block tables and context lengths by one small kernel,
// so nothing is read back and a graph replays it with the step's new metadata.
//
// Covers decode batches (one query row a sequence) in bfloat16 with head_dim 64 or 128 and a GQA
// group size FlashInfer's decode dispatch has (1, 2, 3, 4, 6, 8, 16); flashinfer_decode_fits says
// so, and the caller runs the project's own kernel otherwise (prefill, float32, Qwen2-0.5B's group
// of 7).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>
#include <stdexcept>
#include <string>

#include "kv/paged_attention_flashinfer.h"

namespace crl::kv::detail {

namespace {

constexpr int kIndexThreads = 1024;

// The page arrays of FlashInfer's paged_kv_t from the block tables: indptr[s + 1] - indptr[s]
// pages of sequence s, listed from indices[indptr[s]], the last one holding last_page_len[s]
// tokens; plus the trivial work split of a decode without split-KV (block s takes sequence s
// whole). One block: a block-wide scan in chunks of kIndexThreads sequences, then a warp a
// sequence copying its block-table row.
__global__ void __launch_bounds__(kIndexThreads)
    build_page_arrays(const int32_t* __restrict__ block_tables,
                      const int32_t* __restrict__ context_lens, int seqs, int max_blocks,
                      int block_size, int32_t* __restrict__ indptr, int32_t* __restrict__ indices,
                      int32_t* __restrict__ last_page_len, int32_t* __restrict__ request_indices,
                      int32_t* __restrict__ kv_tile_indices, int32_t* __restrict__ kv_chunk_size) {
  using Scan = cub::BlockScan<int32_t, kIndexThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t carry;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    carry = 0;
    indptr[0] = 0;
    *kv_chunk_size = 0;  // read by the kernel, used only with split-KV
  }
  __syncthreads();
  for (int base = 0; base < seqs; base += kIndexThreads) {
    const int s = base + tid;
    int32_t pages = 0;
    if (s < seqs) {
      const int32_t len = context_lens[s];
      pages = (len + block_size - 1) / block_size;
      last_page_len[s] = len - (pages - 1) * block_size;
      request_indices[s] = s;
      kv_tile_indices[s] = 0;
    }
    int32_t inclusive = 0, total = 0;
    Scan(scan_storage).InclusiveSum(pages, inclusive, total);
    if (s < seqs) indptr[s + 1] = carry + inclusive;
    __syncthreads();
    if (tid == 0) carry += total;
    __syncthreads();
  }
  const int warp = tid / 32, lane = tid % 32;
  for (int s = warp; s < seqs; s += kIndexThreads / 32) {
    const int32_t start = indptr[s], n = indptr[s + 1] - start;
    for (int j = lane; j < n; j += 32) {
      indices[start + j] = block_tables[static_cast<int64_t>(s) * max_blocks + j];
    }
  }
}

bool group_size_supported(int64_t g) {
  return g == 1 || g == 2 || g == 3 || g == 4 || g == 6 || g == 8 || g == 16;
}

template <uint32_t kHeadDim>
void launch_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, int32_t* indptr, int32_t* indices,
                   int32_t* last_page_len, int32_t* request_indices, int32_t* kv_tile_indices,
                   int32_t* kv_chunk_size, float scale, cudaStream_t stream) {
  using T = __nv_bfloat16;
  using Params = flashinfer::BatchDecodeParams<T, T, T, int32_t>;
  using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                               /*logits_soft_cap=*/false, /*alibi=*/false>;
  const auto seqs = static_cast<uint32_t>(q.size(0));
  const auto num_heads = static_cast<uint32_t>(q.size(1));
  const auto num_kv_heads = static_cast<uint32_t>(k_cache.size(2));
  const auto block_size = static_cast<uint32_t>(k_cache.size(1));
  flashinfer::paged_kv_t<T, int32_t> paged_kv(
      num_kv_heads, block_size, kHeadDim, seqs, flashinfer::QKVLayout::kNHD,
      reinterpret_cast<T*>(k_cache.data_ptr<at::BFloat16>()),
      reinterpret_cast<T*>(v_cache.data_ptr<at::BFloat16>()), indices, indptr, last_page_len);
  Params params(reinterpret_cast<T*>(const_cast<at::BFloat16*>(q.data_ptr<at::BFloat16>())),
                /*q_rope_offset=*/nullptr, paged_kv,
                reinterpret_cast<T*>(out.data_ptr<at::BFloat16>()),
                /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr, num_heads,
                static_cast<int32_t>(q.stride(0)), static_cast<int32_t>(q.stride(1)),
                /*window_left=*/-1, /*logits_soft_cap=*/0.f, scale, /*rope_scale=*/1.f,
                /*rope_theta=*/1e4f);
  params.request_indices = request_indices;
  params.kv_tile_indices = kv_tile_indices;
  params.o_indptr = nullptr;  // split-KV only
  params.kv_chunk_size_ptr = kv_chunk_size;
  params.block_valid_mask = nullptr;
  params.padded_batch_size = seqs;
  const cudaError_t err = flashinfer::BatchDecodeWithPagedKVCacheDispatched<
      kHeadDim, flashinfer::PosEncodingMode::kNone, Variant>(params, /*tmp_v=*/nullptr,
                                                             /*tmp_s=*/nullptr,
                                                             /*enable_pdl=*/false, stream);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("paged_attention: FlashInfer batch decode failed: ") +
                             cudaGetErrorString(err));
  }
}

}  // namespace

bool flashinfer_decode_fits(const at::Tensor& q, const at::Tensor& k_cache,
                            const PagedAttentionMetadata& meta) {
  const int64_t head_dim = q.size(2);
  return q.scalar_type() == at::kBFloat16 && meta.max_query_len == 1 &&
         q.size(0) == meta.context_lens.size(0) && (head_dim == 64 || head_dim == 128) &&
         q.size(1) % k_cache.size(2) == 0 && group_size_supported(q.size(1) / k_cache.size(2)) &&
         q.stride(2) == 1 && k_cache.is_contiguous();
}

void flashinfer_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                       cudaStream_t stream) {
  TORCH_CHECK(out.is_contiguous(), "paged_attention: FlashInfer writes a contiguous output");
  const int64_t seqs = q.size(0);
  const int64_t max_blocks = meta.block_tables.size(1);
  // [indptr S+1 | last_page_len S | request_indices S | kv_tile_indices S | chunk 1 | indices S*B]
  at::Tensor work = at::empty({4 * seqs + 2 + seqs * max_blocks},
                              at::TensorOptions().dtype(at::kInt).device(q.device()));
  int32_t* indptr = work.data_ptr<int32_t>();
  int32_t* last_page_len = indptr + seqs + 1;
  int32_t* request_indices = last_page_len + seqs;
  int32_t* kv_tile_indices = request_indices + seqs;
  int32_t* kv_chunk_size = kv_tile_indices + seqs;
  int32_t* indices = kv_chunk_size + 1;
  build_page_arrays<<<1, kIndexThreads, 0, stream>>>(
      meta.block_tables.data_ptr<int32_t>(), meta.context_lens.data_ptr<int32_t>(),
      static_cast<int>(seqs), static_cast<int>(max_blocks), static_cast<int>(k_cache.size(1)),
      indptr, indices, last_page_len, request_indices, kv_tile_indices, kv_chunk_size);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (q.size(2) == 64) {
    launch_decode<64>(out, q, k_cache, v_cache, indptr, indices, last_page_len, request_indices,
                      kv_tile_indices, kv_chunk_size, scale, stream);
  } else {
    launch_decode<128>(out, q, k_cache, v_cache, indptr, indices, last_page_len, request_indices,
                       kv_tile_indices, kv_chunk_size, scale, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace crl::kv::detail

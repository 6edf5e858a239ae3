// Paged attention: K/V live in a block pool and are read through per-sequence block tables.
//
// Cache layout per layer: k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], the
// model's compute dtype (float32 or bfloat16). A token at position p of a sequence lives in slot
// block_table[p / block_size] * block_size + p % block_size.
//
// A batch holds S sequences with q_len[s] new (query) tokens each, packed into T rows. Query token
// j of sequence s sits at absolute position context_len[s] - q_len[s] + j and attends causally to
// positions [0, that position]. Each row's result is computed independently of every other row
// with a fixed reduction order (ascending positions), so outputs are batch-invariant.
//
// paged_attention.cpp validates and dispatches on device; paged_attention_cpu.cpp is the reference
// kernel; paged_attention_cuda.cu is built only with CRL_WITH_CUDA.
#pragma once

#include <ATen/ATen.h>

#include <memory>

namespace crl::kv {

struct PagedAttentionMetadata {
  at::Tensor slot_mapping;  // [T] int64: cache slot of each new token
  at::Tensor query_start;   // [S + 1] int32: cumulative q_len (row offsets into the packed batch)
  at::Tensor context_lens;  // [S] int32: tokens in the cache for each sequence after this step
  at::Tensor block_tables;  // [S, max_blocks_per_seq] int32 (unused entries arbitrary)
  int64_t max_query_len = 0;
  int64_t max_context_len = 0;
  // A CUDA kernel's per-step work split (FlashInfer's decode: page arrays, split-KV chunks),
  // built by the first layer's attention call and reused by the others. A metadata object
  // describes one step: a new step builds a new one (the copies a forward holds share this).
  mutable std::shared_ptr<void> step_plan;
};

// Writes k, v [T, num_kv_heads, head_dim] into the caches at slot_mapping [T].
void write_kv_cache(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& slot_mapping);

// q: [T, num_heads, head_dim] (num_heads a multiple of num_kv_heads, GQA). Returns [T, num_heads,
// head_dim] in q's dtype; accumulation is float32. Throws std::invalid_argument on shape/dtype or
// device mismatches, naming the argument.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                           double scale);

// The CUDA attention kernel (process-wide; benchmarks and tests compare them). kAuto is
// FlashInfer's decode where it fits (builds with it; 1.29x faster than v4 end to end on
// Qwen3-0.6B's shape on an H200), else v4 (the lane-per-position kernel, measured 2.2x faster than
// v2 end to end on an H100) where head_dim is 32, 64 or 128 and the caches are 16-byte aligned,
// else v2; v4 asked for where it does not fit runs v2. The first value comes from
// CRL_PAGED_ATTENTION (v2 | v4 | flashinfer | auto). v2 and v4 are deterministic and
// batch-invariant; FlashInfer's decode is deterministic, and batch-invariant without split-KV
// (below). They differ in summation order. (v1 and v3 lost on every GPU measured: retired.)
enum class CudaAttentionKernel {
  kAuto,
  kUnrolled,    // v2: a block per (row, query head), four positions in flight per warp
  kFlash,       // v4: a block of 8 warps per (row, KV head), a lane per position, K and V read once
                //     for up to 8 query heads (head_dim 32, 64 or 128; else v2)
  kFlashInfer,  // "flashinfer": FlashInfer's batch decode with split-KV for decode batches in
                // bfloat16 with head_dim 64 or 128 and a GQA group of at most 8 (5, 6 and 7 run as
                // 8 with zero heads padded in); v4 for every other call. Only in builds with
                // FlashInfer's headers (the GPU build path): cuda_attention_kernel_built says.
};
// FlashInfer's decode splits each sequence's context into chunks so that its work items fill at
// most `waves` resident grids of the GPU (0: no split, a block per sequence and KV head: then
// batch-invariant). The first value comes from CRL_FLASHINFER_WAVES; set_ throws
// std::invalid_argument outside 0..kMaxFlashInferWaves.
inline constexpr int64_t kDefaultFlashInferWaves = 8;
inline constexpr int64_t kMaxFlashInferWaves = 64;
void set_flashinfer_split_waves(int64_t waves);
int64_t flashinfer_split_waves();
// Whether this build has `kernel` (kFlashInfer needs FlashInfer's headers at build time).
bool cuda_attention_kernel_built(CudaAttentionKernel kernel);
void set_cuda_attention_kernel(CudaAttentionKernel kernel);
CudaAttentionKernel cuda_attention_kernel();
const char* cuda_attention_kernel_name(CudaAttentionKernel kernel);

// Copies whole blocks src[i] -> dst[i] in both caches of every layer (copy-on-write).
// caches: [num_layers] pairs as a [2, L, num_blocks, ...] tensor; pairs is [P, 2] int64.
void copy_blocks(at::Tensor& kv_cache, const at::Tensor& block_pairs);

namespace detail {
// Device implementations, called by the dispatchers after validation.
void write_kv_cache_cpu(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& slot_mapping);
at::Tensor paged_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                               double scale);
void write_kv_cache_cuda(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& slot_mapping);
at::Tensor paged_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                                double scale);
}  // namespace detail

}  // namespace crl::kv

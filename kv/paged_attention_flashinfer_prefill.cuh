// FlashInfer's batch prefill attention over the paged KV cache (causal, FA2 tensor-core kernel),
// one instantiation per head_dim in its own translation unit (paged_attention_flashinfer_prefill
// {64,128}.cu: each is minutes of nvcc, built in parallel). The plan (FlashInfer's PrefillPlan:
// tiles of queries, KV chunks, merge) is made on the host by paged_attention_flashinfer.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace crl::kv::detail {

// One prefill launch: the query rows [rows, num_qo_heads, head_dim] (row and head strides in
// elements), the caches in NHD pages, FlashInfer's page arrays and the plan's workspaces.
struct FlashInferPrefillLaunch {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride_n = 0, q_stride_h = 0;
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  __nv_bfloat16* out = nullptr;  // [rows, num_qo_heads, head_dim], contiguous
  uint32_t seqs = 0, num_qo_heads = 0, num_kv_heads = 0, block_size = 0;
  int32_t* q_indptr = nullptr;  // [seqs + 1] on the device
  int32_t* kv_indptr = nullptr;
  int32_t* kv_indices = nullptr;
  int32_t* kv_last_page_len = nullptr;
  float scale = 1.0f;
  // From the plan (FlashInfer's PrefillPlanInfo and its workspaces).
  void* int_workspace = nullptr;
  void* float_workspace = nullptr;
  int64_t cta_tile_q = 0, padded_batch_size = 0, total_num_rows = 0;
  int64_t request_indices_offset = 0, qo_tile_indices_offset = 0, kv_tile_indices_offset = 0;
  int64_t o_indptr_offset = 0, kv_chunk_size_ptr_offset = 0, merge_indptr_offset = 0;
  int64_t v_offset = 0, s_offset = 0;
  bool split_kv = false;
  cudaStream_t stream = nullptr;
};

cudaError_t flashinfer_prefill_hd64(const FlashInferPrefillLaunch& l);
cudaError_t flashinfer_prefill_hd128(const FlashInferPrefillLaunch& l);

}  // namespace crl::kv::detail

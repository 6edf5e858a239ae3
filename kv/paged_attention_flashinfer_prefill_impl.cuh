// The body of flashinfer_prefill_hd{64,128} (included by those two translation units alone).
#pragma once

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/utils.cuh>

#include "kv/paged_attention_flashinfer_prefill.cuh"

namespace crl::kv::detail {

template <uint32_t kHeadDim>
cudaError_t flashinfer_prefill_impl(const FlashInferPrefillLaunch& l) {
  using T = __nv_bfloat16;
  using Params = flashinfer::BatchPrefillPagedParams<T, T, T, int32_t>;
  using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                               /*logits_soft_cap=*/false, /*alibi=*/false>;
  auto at = [](void* base, int64_t offset) { return static_cast<char*>(base) + offset; };
  flashinfer::paged_kv_t<T, int32_t> paged_kv(l.num_kv_heads, l.block_size, kHeadDim, l.seqs,
                                              flashinfer::QKVLayout::kNHD, l.k_cache, l.v_cache,
                                              l.kv_indices, l.kv_indptr, l.kv_last_page_len);
  Params params(const_cast<T*>(l.q), paged_kv, /*maybe_custom_mask=*/nullptr, l.q_indptr,
                /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr, l.out,
                /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr, l.num_qo_heads,
                static_cast<int32_t>(l.q_stride_n), static_cast<int32_t>(l.q_stride_h),
                /*window_left=*/-1, /*logits_soft_cap=*/0.f, l.scale, /*rope_scale=*/1.f,
                /*rope_theta=*/1e4f);
  params.request_indices =
      reinterpret_cast<int32_t*>(at(l.int_workspace, l.request_indices_offset));
  params.qo_tile_indices =
      reinterpret_cast<int32_t*>(at(l.int_workspace, l.qo_tile_indices_offset));
  params.kv_tile_indices =
      reinterpret_cast<int32_t*>(at(l.int_workspace, l.kv_tile_indices_offset));
  params.o_indptr = reinterpret_cast<int32_t*>(at(l.int_workspace, l.o_indptr_offset));
  params.kv_chunk_size_ptr =
      reinterpret_cast<int32_t*>(at(l.int_workspace, l.kv_chunk_size_ptr_offset));
  T* tmp_v = nullptr;
  float* tmp_s = nullptr;
  if (l.split_kv) {
    params.merge_indptr = reinterpret_cast<int32_t*>(at(l.int_workspace, l.merge_indptr_offset));
    tmp_v = reinterpret_cast<T*>(at(l.float_workspace, l.v_offset));
    tmp_s = reinterpret_cast<float*>(at(l.float_workspace, l.s_offset));
  }
  params.padded_batch_size = static_cast<uint32_t>(l.padded_batch_size);
  params.max_total_num_rows = static_cast<uint32_t>(l.total_num_rows);
  cudaError_t status = cudaSuccess;
  DISPATCH_CTA_TILE_Q(l.cta_tile_q, CTA_TILE_Q, {
    status = flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        CTA_TILE_Q, kHeadDim, kHeadDim, flashinfer::PosEncodingMode::kNone,
        /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal, Variant, Params>(
        params, tmp_v, tmp_s, /*enable_pdl=*/false, l.stream);
  });
  return status;
}

}  // namespace crl::kv::detail

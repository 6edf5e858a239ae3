// FlashInfer's batch decode attention over the paged KV cache (paged_attention_flashinfer.cu, built
// where the GPU build finds FlashInfer's headers: CRL_WITH_FLASHINFER). Internal to kv/: the
// dispatcher in paged_attention_cuda.cu calls it for CudaAttentionKernel::kFlashInfer.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "kv/paged_attention.h"

namespace crl::kv::detail {

// Whether FlashInfer's decode kernel covers this call: one query row a sequence (a decode
// batch), bfloat16, head_dim 64 or 128, a GQA group size of 1, 2, 3, 4, 6, 8 or 16.
bool flashinfer_decode_fits(const at::Tensor& q, const at::Tensor& k_cache,
                            const PagedAttentionMetadata& meta);

// out [S, num_heads, head_dim] = attention of q [S, num_heads, head_dim] over each sequence's
// context_lens[s] cached positions. REQUIRES: flashinfer_decode_fits(q, k_cache, meta).
void flashinfer_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                       cudaStream_t stream);

// FlashInfer's batch prefill (causal, tensor cores) for any other call in bfloat16 with head_dim
// 64 or 128 and every sequence holding query rows: prefill and mixed steps, and decode batches
// whose group decode does not take. Plans on the host from the lengths read back (one sync a
// step, reused by the step's other layers), so never while a CUDA graph is captured. Returns
// false, having done nothing, where it does not fit (the caller runs v4).
bool flashinfer_prefill(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const PagedAttentionMetadata& meta, float scale,
                        cudaStream_t stream);

}  // namespace crl::kv::detail

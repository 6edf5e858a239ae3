// FlashInfer's paged prefill attention for head_dim 64 (paged_attention_flashinfer_prefill.cuh).
#include "kv/paged_attention_flashinfer_prefill_impl.cuh"

namespace crl::kv::detail {

cudaError_t flashinfer_prefill_hd64(const FlashInferPrefillLaunch& l) {
  return flashinfer_prefill_impl<64>(l);
}

}  // namespace crl::kv::detail

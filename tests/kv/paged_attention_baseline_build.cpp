// A second copy of the CPU paged-attention kernel, built for the baseline x86-64 instruction set
// (no -march=native) and with the project namespace renamed (-Dcrl=crl_baseline, see
// tests/CMakeLists.txt) so it links beside crl_kv's native build. paged_attention_isa_test.cpp
// checks that both builds give the same bits: the kernel's results do not depend on the ISA the
// compiler targets, which deterministic mode's cross-CPU guarantee relies on.
#include "kv/paged_attention_cpu.cpp"

at::Tensor paged_attention_cpu_baseline_build(const at::Tensor& q, const at::Tensor& k_cache,
                                              const at::Tensor& v_cache,
                                              const at::Tensor& query_start,
                                              const at::Tensor& context_lens,
                                              const at::Tensor& block_tables, int64_t max_query_len,
                                              int64_t max_context_len, double scale) {
  crl::kv::PagedAttentionMetadata meta;
  meta.query_start = query_start;
  meta.context_lens = context_lens;
  meta.block_tables = block_tables;
  meta.max_query_len = max_query_len;
  meta.max_context_len = max_context_len;
  return crl::kv::detail::paged_attention_cpu(q, k_cache, v_cache, meta, scale);
}

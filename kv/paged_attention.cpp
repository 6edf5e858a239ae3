// Validation and device dispatch for the paged-attention ops (contract in kv/paged_attention.h).
//
// Shapes, dtypes, devices and contiguity are checked on every device. Metadata *values* (slot and
// block ids in range, query_start monotone, context_lens >= q_len) are checked only when the
// metadata lives on the CPU: on CUDA that would cost a device sync per layer, so there the caller's
// metadata is trusted (the CUDA kernels still skip out-of-range cache slots when writing).
#include "kv/paged_attention.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "common/check.h"

namespace crl::kv {

namespace {

bool is_supported_float(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; }

// Checks that `t` is a defined, contiguous `dim`-d tensor of `dtype` on `device`.
void check_tensor(const at::Tensor& t, const char* fn, const char* name, int64_t dim,
                  at::ScalarType dtype, const at::Device& device) {
  if (!t.defined()) CRL_INVALID(fn, ": ", name, " is undefined");
  if (t.dim() != dim) {
    CRL_INVALID(fn, ": ", name, " must have ", dim, " dims, got shape ", t.sizes());
  }
  if (t.scalar_type() != dtype) {
    CRL_INVALID(fn, ": ", name, " must have dtype ", dtype, ", got ", t.scalar_type());
  }
  if (t.device() != device) {
    CRL_INVALID(fn, ": ", name, " is on ", t.device(), " but expected ", device);
  }
  if (!t.is_contiguous()) CRL_INVALID(fn, ": ", name, " must be contiguous");
}

// k_cache / v_cache: identical contiguous [num_blocks, block_size, num_kv_heads, head_dim] tensors
// of float32 or bfloat16, on the same device.
void check_caches(const at::Tensor& k_cache, const at::Tensor& v_cache, const char* fn) {
  if (!k_cache.defined()) CRL_INVALID(fn, ": k_cache is undefined");
  if (!is_supported_float(k_cache.scalar_type())) {
    CRL_INVALID(fn, ": k_cache must be float32 or bfloat16, got ", k_cache.scalar_type());
  }
  check_tensor(k_cache, fn, "k_cache", 4, k_cache.scalar_type(), k_cache.device());
  check_tensor(v_cache, fn, "v_cache", 4, k_cache.scalar_type(), k_cache.device());
  if (v_cache.sizes() != k_cache.sizes()) {
    CRL_INVALID(fn, ": v_cache shape ", v_cache.sizes(), " differs from k_cache shape ",
                k_cache.sizes());
  }
  if (k_cache.size(1) <= 0 || k_cache.size(2) <= 0 || k_cache.size(3) <= 0) {
    CRL_INVALID(fn, ": k_cache has an empty block_size/num_kv_heads/head_dim: ", k_cache.sizes());
  }
}

// Value checks of the attention metadata; all tensors are CPU, contiguous int32 here.
void check_metadata_values(const PagedAttentionMetadata& meta, int64_t num_rows, int64_t num_blocks,
                           int64_t block_size) {
  const int64_t num_seqs = meta.context_lens.size(0);
  const int64_t max_blocks = meta.block_tables.size(1);
  const int32_t* qs = meta.query_start.data_ptr<int32_t>();
  const int32_t* cl = meta.context_lens.data_ptr<int32_t>();
  const int32_t* bt = meta.block_tables.data_ptr<int32_t>();
  if (qs[0] != 0) CRL_INVALID("paged_attention: query_start[0] must be 0, got ", qs[0]);
  if (qs[num_seqs] != num_rows) {
    CRL_INVALID("paged_attention: query_start[", num_seqs, "] = ", qs[num_seqs],
                " must equal the number of rows of q (", num_rows, ")");
  }
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = int64_t{qs[s + 1]} - qs[s];
    if (q_len < 0) CRL_INVALID("paged_attention: query_start must be non-decreasing at ", s);
    if (cl[s] < q_len) {
      CRL_INVALID("paged_attention: context_lens[", s, "] = ", cl[s], " is less than its q_len ",
                  q_len);
    }
    if (q_len == 0) continue;
    const int64_t used_blocks = (int64_t{cl[s]} + block_size - 1) / block_size;
    if (used_blocks > max_blocks) {
      CRL_INVALID("paged_attention: context_lens[", s, "] = ", cl[s], " needs ", used_blocks,
                  " blocks but block_tables has ", max_blocks, " columns");
    }
    for (int64_t b = 0; b < used_blocks; ++b) {
      const int32_t id = bt[s * max_blocks + b];
      if (id < 0 || id >= num_blocks) {
        CRL_INVALID("paged_attention: block_tables[", s, ", ", b, "] = ", id, " is outside [0, ",
                    num_blocks, ")");
      }
    }
  }
}

[[noreturn]] void throw_no_cuda(const char* fn) {
  throw std::runtime_error(std::string(fn) + ": built without CUDA");
}

[[noreturn]] void throw_bad_device(const char* fn, const at::Device& device) {
  CRL_INVALID(fn, ": unsupported device ", device);
}

}  // namespace

void write_kv_cache(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& slot_mapping) {
  constexpr const char* fn = "write_kv_cache";
  check_caches(k_cache, v_cache, fn);
  const at::Device device = k_cache.device();
  check_tensor(k, fn, "k", 3, k_cache.scalar_type(), device);
  check_tensor(v, fn, "v", 3, k_cache.scalar_type(), device);
  if (k.size(1) != k_cache.size(2) || k.size(2) != k_cache.size(3)) {
    CRL_INVALID(fn, ": k must be [T, ", k_cache.size(2), ", ", k_cache.size(3),
                "] to match k_cache, got ", k.sizes());
  }
  if (v.sizes() != k.sizes()) {
    CRL_INVALID(fn, ": v shape ", v.sizes(), " differs from k shape ", k.sizes());
  }
  check_tensor(slot_mapping, fn, "slot_mapping", 1, at::kLong, device);
  if (slot_mapping.size(0) != k.size(0)) {
    CRL_INVALID(fn, ": slot_mapping has ", slot_mapping.size(0), " entries but k has ", k.size(0),
                " rows");
  }
  if (device.is_cpu()) {
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    const int64_t* slots = slot_mapping.data_ptr<int64_t>();
    for (int64_t t = 0; t < slot_mapping.size(0); ++t) {
      if (slots[t] < 0 || slots[t] >= num_slots) {
        CRL_INVALID(fn, ": slot_mapping[", t, "] = ", slots[t], " is outside [0, ", num_slots, ")");
      }
    }
  }
  if (k.size(0) == 0) return;

  if (device.is_cpu()) return detail::write_kv_cache_cpu(k_cache, v_cache, k, v, slot_mapping);
  if (device.is_cuda()) {
#ifdef CRL_WITH_CUDA
    return detail::write_kv_cache_cuda(k_cache, v_cache, k, v, slot_mapping);
#else
    throw_no_cuda(fn);
#endif
  }
  throw_bad_device(fn, device);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const PagedAttentionMetadata& meta,
                           double scale) {
  constexpr const char* fn = "paged_attention";
  if (!q.defined()) CRL_INVALID(fn, ": q is undefined");
  if (!is_supported_float(q.scalar_type())) {
    CRL_INVALID(fn, ": q must be float32 or bfloat16, got ", q.scalar_type());
  }
  check_tensor(q, fn, "q", 3, q.scalar_type(), q.device());
  const at::Device device = q.device();
  check_caches(k_cache, v_cache, fn);
  if (k_cache.scalar_type() != q.scalar_type()) {
    CRL_INVALID(fn, ": k_cache dtype ", k_cache.scalar_type(), " differs from q dtype ",
                q.scalar_type());
  }
  if (k_cache.device() != device) {
    CRL_INVALID(fn, ": k_cache is on ", k_cache.device(), " but q is on ", device);
  }
  if (k_cache.size(3) != q.size(2)) {
    CRL_INVALID(fn, ": head_dim of k_cache (", k_cache.size(3), ") differs from q (", q.size(2),
                ")");
  }
  const int64_t num_heads = q.size(1);
  const int64_t num_kv_heads = k_cache.size(2);
  if (num_heads == 0 || num_heads % num_kv_heads != 0) {
    CRL_INVALID(fn, ": num_heads (q.size(1) = ", num_heads,
                ") must be a positive multiple of num_kv_heads (k_cache.size(2) = ", num_kv_heads,
                ")");
  }
  check_tensor(meta.query_start, fn, "query_start", 1, at::kInt, device);
  check_tensor(meta.context_lens, fn, "context_lens", 1, at::kInt, device);
  check_tensor(meta.block_tables, fn, "block_tables", 2, at::kInt, device);
  const int64_t num_seqs = meta.context_lens.size(0);
  if (meta.query_start.size(0) != num_seqs + 1) {
    CRL_INVALID(fn, ": query_start has ", meta.query_start.size(0), " entries, expected ",
                num_seqs + 1, " (num_seqs + 1)");
  }
  if (meta.block_tables.size(0) != num_seqs) {
    CRL_INVALID(fn, ": block_tables has ", meta.block_tables.size(0), " rows, expected ", num_seqs,
                " (one per sequence)");
  }
  if (!std::isfinite(scale)) CRL_INVALID(fn, ": scale must be finite, got ", scale);
  if (device.is_cpu()) {
    check_metadata_values(meta, q.size(0), k_cache.size(0), k_cache.size(1));
  }
  if (q.size(0) == 0) return at::empty_like(q);

  if (device.is_cpu()) return detail::paged_attention_cpu(q, k_cache, v_cache, meta, scale);
  if (device.is_cuda()) {
#ifdef CRL_WITH_CUDA
    return detail::paged_attention_cuda(q, k_cache, v_cache, meta, scale);
#else
    throw_no_cuda(fn);
#endif
  }
  throw_bad_device(fn, device);
}

void copy_blocks(at::Tensor& kv_cache, const at::Tensor& block_pairs) {
  constexpr const char* fn = "copy_blocks";
  if (!kv_cache.defined()) CRL_INVALID(fn, ": kv_cache is undefined");
  if (kv_cache.dim() != 6 || kv_cache.size(0) != 2) {
    CRL_INVALID(fn,
                ": kv_cache must be [2, num_layers, num_blocks, block_size, num_kv_heads, "
                "head_dim], got ",
                kv_cache.sizes());
  }
  if (!block_pairs.defined()) CRL_INVALID(fn, ": block_pairs is undefined");
  if (block_pairs.dim() != 2 || block_pairs.size(1) != 2) {
    CRL_INVALID(fn, ": block_pairs must be [P, 2], got shape ", block_pairs.sizes());
  }
  if (block_pairs.scalar_type() != at::kLong) {
    CRL_INVALID(fn, ": block_pairs must have dtype Long, got ", block_pairs.scalar_type());
  }
  if (!block_pairs.device().is_cpu() && block_pairs.device() != kv_cache.device()) {
    CRL_INVALID(fn, ": block_pairs is on ", block_pairs.device(), " but kv_cache is on ",
                kv_cache.device());
  }
  const int64_t num_pairs = block_pairs.size(0);
  if (num_pairs == 0) return;
  if (block_pairs.device().is_cpu()) {
    // Every destination must be distinct: with duplicates the surviving copy would be unspecified.
    const at::Tensor pairs = block_pairs.contiguous();
    const int64_t* p = pairs.data_ptr<int64_t>();
    const int64_t num_blocks = kv_cache.size(2);
    std::unordered_set<int64_t> dsts;
    for (int64_t i = 0; i < 2 * num_pairs; ++i) {
      if (p[i] < 0 || p[i] >= num_blocks) {
        CRL_INVALID(fn, ": block_pairs[", i / 2, ", ", i % 2, "] = ", p[i], " is outside [0, ",
                    num_blocks, ")");
      }
      if (i % 2 == 1 && !dsts.insert(p[i]).second) {
        CRL_INVALID(fn, ": block_pairs has destination block ", p[i], " more than once");
      }
    }
  }
  // All sources are read before any destination is written, so a block that is both a source and a
  // destination contributes its pre-call contents.
  const at::Tensor pairs = block_pairs.to(kv_cache.device());
  const at::Tensor src = pairs.select(1, 0).contiguous();
  const at::Tensor dst = pairs.select(1, 1).contiguous();
  kv_cache.index_copy_(2, dst, kv_cache.index_select(2, src));
}

namespace {

CudaAttentionKernel kernel_from_env() {
  const char* e = std::getenv("CRL_PAGED_ATTENTION");
  const std::string v = e == nullptr ? "auto" : e;
  if (v == "v2") return CudaAttentionKernel::kUnrolled;
  if (v == "v4") return CudaAttentionKernel::kFlash;
  if (v == "flashinfer") {
    if (!cuda_attention_kernel_built(CudaAttentionKernel::kFlashInfer)) {
      throw std::invalid_argument(
          "CRL_PAGED_ATTENTION=flashinfer: this build has no FlashInfer (the GPU build path, "
          "scripts/bootstrap.sh --cuda, compiles it)");
    }
    return CudaAttentionKernel::kFlashInfer;
  }
  if (v == "v1" || v == "v3") {
    throw std::invalid_argument("CRL_PAGED_ATTENTION=" + v +
                                ": that kernel was retired (slower than v2 and v4 "
                                "on every GPU measured); expected v2, v4, flashinfer or auto");
  }
  if (v != "auto" && !v.empty()) {
    throw std::invalid_argument("CRL_PAGED_ATTENTION=" + v +
                                ": expected v2, v4, flashinfer or auto");
  }
  return CudaAttentionKernel::kAuto;
}

std::atomic<CudaAttentionKernel>& selected_kernel() {
  static std::atomic<CudaAttentionKernel> k{kernel_from_env()};
  return k;
}

int64_t waves_from_env() {
  const char* e = std::getenv("CRL_FLASHINFER_WAVES");
  if (e == nullptr || *e == '\0') return kDefaultFlashInferWaves;
  char* end = nullptr;
  const long n = std::strtol(e, &end, 10);
  if (*end != '\0' || n < 0 || n > kMaxFlashInferWaves) {
    throw std::invalid_argument(std::string("CRL_FLASHINFER_WAVES=") + e +
                                ": expected an integer from 0 (no split-KV) to " +
                                std::to_string(kMaxFlashInferWaves));
  }
  return n;
}

std::atomic<int64_t>& selected_waves() {
  static std::atomic<int64_t> w{waves_from_env()};
  return w;
}

}  // namespace

void set_flashinfer_split_waves(int64_t waves) {
  if (waves < 0 || waves > kMaxFlashInferWaves) {
    throw std::invalid_argument("FlashInfer split waves must be in 0.." +
                                std::to_string(kMaxFlashInferWaves) + ", not " +
                                std::to_string(waves));
  }
  selected_waves().store(waves);
}

int64_t flashinfer_split_waves() { return selected_waves().load(); }

void set_cuda_attention_kernel(CudaAttentionKernel kernel) { selected_kernel().store(kernel); }

CudaAttentionKernel cuda_attention_kernel() { return selected_kernel().load(); }

bool cuda_attention_kernel_built(CudaAttentionKernel kernel) {
#ifdef CRL_WITH_FLASHINFER
  return true;
#else
  return kernel != CudaAttentionKernel::kFlashInfer;
#endif
}

const char* cuda_attention_kernel_name(CudaAttentionKernel kernel) {
  switch (kernel) {
    case CudaAttentionKernel::kAuto:
      return "auto";
    case CudaAttentionKernel::kUnrolled:
      return "v2";
    case CudaAttentionKernel::kFlash:
      return "v4";
    case CudaAttentionKernel::kFlashInfer:
      return "flashinfer";
  }
  return "?";
}

}  // namespace crl::kv

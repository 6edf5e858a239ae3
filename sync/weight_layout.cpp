#include "sync/weight_layout.h"

#include <torch/version.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "common/check.h"
#include "common/host_memory.h"

namespace crl::sync {
namespace {

int64_t align_up(int64_t n, int64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// 64-bit FNV-1a; integers are fed as 8 little-endian bytes so the hash is platform independent.
class Fnv1a {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 0x100000001b3ULL;
    }
  }
  void u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// A buffer views() or pack() may alias: contiguous 1-D uint8 with at least `nbytes` bytes.
void check_buffer(const at::Tensor& t, int64_t nbytes, int64_t alignment, const char* what,
                  int64_t bucket) {
  if (!t.defined() || t.scalar_type() != at::kByte || t.dim() != 1 || !t.is_contiguous() ||
      t.numel() < nbytes || t.storage_offset() % alignment != 0) {
    CRL_INVALID(what, " for bucket ", bucket, " must be a contiguous 1-D uint8 tensor of at least ",
                nbytes, " bytes at a storage offset aligned to ", alignment, ", got ",
                t.defined() ? c10::toString(t.scalar_type()) + std::string(" ") +
                                  shape_str(t.sizes().vec()) +
                                  (t.is_contiguous() ? "" : " non-contiguous") + " at offset " +
                                  std::to_string(t.storage_offset())
                            : std::string("undefined"));
  }
}

// The bytes [offset, offset + spec.nbytes()) of `buffer` as a tensor of the spec's dtype and shape.
at::Tensor view_entry(const at::Tensor& buffer, const BucketEntry& e, const TensorSpec& spec) {
  return buffer.narrow(0, e.offset, e.nbytes).view(spec.dtype).view(spec.shape);
}

// ATen's multi-tensor copy (one kernel for a list, casting where the dtypes differ; a list it
// cannot take, e.g. mixed source dtypes, falls back to one copy_ each inside ATen). libtorch 2.x
// only: Debian's 1.13 has neither op, and its build never packs on a GPU.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
constexpr bool kForeachCopy = true;
void foreach_copy(std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  at::_foreach_copy_(dst, src);
}
void foreach_zero(std::vector<at::Tensor>& t) { at::_foreach_zero_(t); }
#else
constexpr bool kForeachCopy = false;
void foreach_copy(std::vector<at::Tensor>&, const std::vector<at::Tensor>&) {}
void foreach_zero(std::vector<at::Tensor>&) {}
#endif

}  // namespace

int64_t TensorSpec::nbytes() const {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

std::string describe(const TensorSpec& spec) {
  return spec.name + " " + shape_str(spec.shape) + " " + c10::toString(spec.dtype);
}

WeightLayout WeightLayout::plan(std::vector<TensorSpec> specs, int64_t bucket_bytes,
                                int64_t alignment) {
  if (bucket_bytes <= 0) CRL_INVALID("WeightLayout: bucket_bytes must be > 0, got ", bucket_bytes);
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    CRL_INVALID("WeightLayout: alignment must be a power of two, got ", alignment);
  }
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    if (s.name.empty()) CRL_INVALID("WeightLayout: tensor ", i, " has an empty name");
    if (!names.insert(s.name).second) {
      CRL_INVALID("WeightLayout: duplicate tensor name '", s.name, "' (tensor ", i, ")");
    }
    for (int64_t d : s.shape) {
      if (d < 0) CRL_INVALID("WeightLayout: tensor ", i, " ", describe(s), " has a negative dim");
    }
  }

  WeightLayout layout;
  layout.bucket_bytes_ = bucket_bytes;
  layout.alignment_ = alignment;
  std::vector<Bucket>& buckets = layout.buckets_;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t nbytes = specs[i].nbytes();
    // Open a new bucket when there is none yet or this tensor would push the current one past the
    // cap; a tensor that does not fit even alone still gets its (oversize) bucket.
    if (buckets.empty() || align_up(buckets.back().nbytes + nbytes, alignment) > bucket_bytes) {
      buckets.push_back(Bucket{static_cast<int64_t>(buckets.size()), 0, {}});
    }
    Bucket& b = buckets.back();
    b.entries.push_back(BucketEntry{static_cast<int64_t>(i), b.nbytes, nbytes});
    b.nbytes = align_up(b.nbytes + nbytes, alignment);
  }

  Fnv1a h;
  h.str("crl.sync.WeightLayout.v1");
  h.u64(specs.size());
  for (const TensorSpec& s : specs) {
    h.str(s.name);
    h.u64(s.shape.size());
    for (int64_t d : s.shape) h.u64(static_cast<uint64_t>(d));
    h.str(c10::toString(s.dtype));
  }
  h.u64(static_cast<uint64_t>(bucket_bytes));
  h.u64(static_cast<uint64_t>(alignment));
  h.u64(buckets.size());
  for (const Bucket& b : buckets) {
    h.u64(static_cast<uint64_t>(b.nbytes));
    h.u64(b.entries.size());
    for (const BucketEntry& e : b.entries) h.u64(static_cast<uint64_t>(e.offset));
    layout.total_bytes_ += b.nbytes;
    layout.max_bucket_nbytes_ = std::max(layout.max_bucket_nbytes_, b.nbytes);
  }
  layout.hash_ = h.value();
  layout.specs_ = std::move(specs);
  return layout;
}

std::optional<std::string> WeightLayout::first_difference(const WeightLayout& other) const {
  const std::vector<TensorSpec>& a = specs_;
  const std::vector<TensorSpec>& b = other.specs_;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].dtype != b[i].dtype) {
      return ::crl::detail::str_cat("weight layout differs at tensor ", i, ": this ",
                                    describe(a[i]), ", other ", describe(b[i]));
    }
  }
  if (a.size() != b.size()) {
    const TensorSpec& extra = a.size() > b.size() ? a[b.size()] : b[a.size()];
    return ::crl::detail::str_cat("weight layout tensor count differs: this ", a.size(), ", other ",
                                  b.size(), " (first unmatched tensor ",
                                  std::min(a.size(), b.size()), ": ", describe(extra), ")");
  }
  if (bucket_bytes_ != other.bucket_bytes_) {
    return ::crl::detail::str_cat("weight layout bucket size differs: this ", bucket_bytes_,
                                  " bytes, other ", other.bucket_bytes_, " bytes");
  }
  if (alignment_ != other.alignment_) {
    return ::crl::detail::str_cat("weight layout alignment differs: this ", alignment_, ", other ",
                                  other.alignment_);
  }
  // Equal inputs plan equal buckets; a differing hash here means differing planner versions.
  if (hash_ != other.hash_)
    return std::string("weight layout specs are equal but the hashes differ");
  return std::nullopt;
}

std::vector<std::pair<int64_t, int64_t>> WeightLayout::chunks(int64_t chunk_bytes) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t n = static_cast<int64_t>(buckets_.size());
  int64_t first = 0, bytes = 0;
  for (int64_t b = 0; b < n; ++b) {
    if (b > first && chunk_bytes > 0 && bytes + buckets_[b].nbytes > chunk_bytes) {
      out.emplace_back(first, b);
      first = b;
      bytes = 0;
    }
    bytes += buckets_[b].nbytes;
  }
  if (n > 0) out.emplace_back(first, n);
  return out;
}

std::vector<at::Tensor> WeightLayout::allocate_buckets(at::TensorOptions options) const {
  std::vector<at::Tensor> out;
  out.reserve(buckets_.size());
  for (const Bucket& b : buckets_) {
    out.push_back(
        zeros_in_huge_pages({b.nbytes}, options.dtype(at::kByte), "a weight-sync bucket"));
  }
  return out;
}

std::vector<at::Tensor> WeightLayout::views(const std::vector<at::Tensor>& buckets) const {
  if (buckets.size() != buckets_.size()) {
    CRL_INVALID("WeightLayout::views: expected ", buckets_.size(), " bucket tensors, got ",
                buckets.size());
  }
  std::vector<at::Tensor> out(specs_.size());
  for (const Bucket& b : buckets_) {
    const at::Tensor& buf = buckets[b.index];
    check_buffer(buf, b.nbytes, alignment_, "bucket tensor", b.index);
    if (buf.numel() != b.nbytes) {
      CRL_INVALID("WeightLayout::views: bucket ", b.index, " has ", buf.numel(),
                  " bytes, the layout says ", b.nbytes);
    }
    for (const BucketEntry& e : b.entries) out[e.tensor] = view_entry(buf, e, specs_[e.tensor]);
  }
  return out;
}

void WeightLayout::pack(const std::vector<at::Tensor>& tensors, int64_t bucket,
                        at::Tensor& dst) const {
  if (bucket < 0 || bucket >= static_cast<int64_t>(buckets_.size())) {
    CRL_INVALID("WeightLayout::pack: bucket ", bucket, " out of range [0, ", buckets_.size(), ")");
  }
  if (tensors.size() != specs_.size()) {
    CRL_INVALID("WeightLayout::pack: expected ", specs_.size(), " tensors, got ", tensors.size());
  }
  const Bucket& b = buckets_[bucket];
  check_buffer(dst, b.nbytes, alignment_, "send buffer", bucket);
  // On a GPU one launch per bucket instead of one per tensor and gap: a cast bucket of a 0.5B
  // model is ~290 copies, and their launches, not the bytes, set the time.
  const bool batched = kForeachCopy && dst.is_cuda() && b.entries.size() > 1;
  std::vector<at::Tensor> outs, ins, gaps;
  int64_t end = 0;  // end of the previous entry: [end, e.offset) is padding
  for (const BucketEntry& e : b.entries) {
    const TensorSpec& spec = specs_[e.tensor];
    const at::Tensor& src = tensors[e.tensor];
    if (!src.defined() || src.sizes() != at::IntArrayRef(spec.shape)) {
      CRL_INVALID("WeightLayout::pack: tensor ", e.tensor, " should be ", describe(spec), ", got ",
                  src.defined() ? shape_str(src.sizes().vec()) : std::string("undefined"));
    }
    if (e.offset > end) gaps.push_back(dst.narrow(0, end, e.offset - end));
    outs.push_back(view_entry(dst, e, spec));
    ins.push_back(src);
    end = e.offset + e.nbytes;
  }
  if (b.nbytes > end) gaps.push_back(dst.narrow(0, end, b.nbytes - end));
  if (!batched) {
    for (auto& g : gaps) g.zero_();
    for (size_t i = 0; i < outs.size(); ++i) outs[i].copy_(ins[i]);
    return;
  }
  // ATen batches a list only when every destination shares a dtype, every source too, and their
  // strides match: one list per (destination, source) dtype pair; a strided or off-device source
  // is copied alone.
  std::vector<std::pair<std::pair<at::ScalarType, at::ScalarType>,
                        std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>>>
      lists;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!ins[i].is_contiguous() || ins[i].device() != dst.device()) {
      outs[i].copy_(ins[i]);
      continue;
    }
    const auto key = std::make_pair(outs[i].scalar_type(), ins[i].scalar_type());
    auto it =
        std::find_if(lists.begin(), lists.end(), [&](const auto& l) { return l.first == key; });
    if (it == lists.end()) it = lists.insert(lists.end(), {key, {}});
    it->second.first.push_back(outs[i]);
    it->second.second.push_back(ins[i]);
  }
  for (auto& [key, l] : lists) foreach_copy(l.first, l.second);
  if (!gaps.empty()) foreach_zero(gaps);
}

}  // namespace crl::sync

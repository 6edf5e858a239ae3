// WeightLayout: the agreed byte layout of a model's weights for bucketed weight sync
// (docs/design.md §3).
//
// A layout is a pure function of (ordered specs, bucket_bytes, alignment): every rank, trainer and
// engine alike, calls plan() on the same specs and gets the same buckets, offsets and hash(). The
// hash is exchanged once at setup; on a mismatch the ranks compare layouts with first_difference(),
// which names the first differing tensor. After that a sync is just one transfer per bucket.
//
// Packing (plan): tensors are placed in spec order; each starts at a multiple of `alignment` after
// the previous one's end. A bucket's nbytes is the aligned end of its last entry and never exceeds
// bucket_bytes, except for a bucket holding a single tensor that does not fit on its own (an
// oversize tensor gets a bucket alone). Entries never overlap; the gaps between them are padding.
//
// Storage: allocate_buckets() gives one zero-filled uint8 buffer per bucket; views() turns those
// buffers into the model's tensors (aliases, no copy), so a receive into a bucket lands in place in
// the live weights. pack() fills a sender's buffer from the trainer's tensors, casting dtypes.
//
// Depends only on libtorch and std. A WeightLayout is an immutable value: safe to share across
// threads once built.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace crl::sync {

// One tensor as the receiving side stores it.
struct TensorSpec {
  std::string name;            // unique within a layout, e.g. "model.layers.0.mlp.up_proj.weight"
  std::vector<int64_t> shape;  // every dim >= 0; {} is a scalar
  at::ScalarType dtype;        // the dtype inside the bucket (the engine's dtype)

  // numel(shape) * element size of dtype.
  int64_t nbytes() const;
};

// Where one tensor lives inside its bucket.
struct BucketEntry {
  int64_t tensor;  // index into WeightLayout::specs()
  int64_t offset;  // byte offset inside the bucket, a multiple of the layout's alignment
  int64_t nbytes;  // == specs()[tensor].nbytes()
};

struct Bucket {
  int64_t index;                     // position in WeightLayout::buckets()
  int64_t nbytes;                    // aligned end of the last entry: the bucket buffer's size
  std::vector<BucketEntry> entries;  // in spec order, increasing offsets
};

class WeightLayout {
 public:
  // Packs `specs` (in order) into buckets of at most `bucket_bytes`, every offset a multiple of
  // `alignment`. Throws std::invalid_argument on bucket_bytes <= 0, an alignment that is not a
  // power of two, a duplicate or empty name, or a negative dim.
  static WeightLayout plan(std::vector<TensorSpec> specs, int64_t bucket_bytes,
                           int64_t alignment = 256);

  const std::vector<TensorSpec>& specs() const { return specs_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Sum of the buckets' nbytes (padding included).
  int64_t total_bytes() const { return total_bytes_; }
  // The cap passed to plan().
  int64_t bucket_bytes() const { return bucket_bytes_; }
  int64_t alignment() const { return alignment_; }
  // The largest bucket's nbytes (0 without buckets): enough for one reusable send buffer.
  int64_t max_bucket_nbytes() const { return max_bucket_nbytes_; }
  // The buckets cut into runs of consecutive ones, each [first, end) of at most `chunk_bytes` (a
  // bucket larger than that alone), in order and covering every bucket; chunk_bytes <= 0: one run.
  // A streamed send (WeightSync) goes through them one at a time.
  std::vector<std::pair<int64_t, int64_t>> chunks(int64_t chunk_bytes) const;

  // 64-bit FNV-1a over the names, shapes, dtypes (by name), bucket_bytes, alignment and the
  // resulting offsets. Equal inputs give equal hashes on every rank, build and run.
  uint64_t hash() const { return hash_; }

  // nullopt when the layouts are equal; otherwise one line naming the first differing tensor
  // (index, then name, shape and dtype on both sides), or the differing tensor count, bucket size
  // or alignment. "this" is *this, "other" is `other`.
  std::optional<std::string> first_difference(const WeightLayout& other) const;

  // One zero-filled uint8 tensor of bucket.nbytes per bucket, with `options`' device (its dtype is
  // overridden to uint8).
  std::vector<at::Tensor> allocate_buckets(at::TensorOptions options) const;

  // One tensor per spec, in spec order, with the spec's dtype and shape, each a view aliasing its
  // bucket's memory (it keeps that bucket's storage alive). REQUIRES: buckets as from
  // allocate_buckets(): one contiguous 1-D uint8 tensor of bucket.nbytes per bucket, with a
  // storage offset that keeps the alignment; throws std::invalid_argument otherwise.
  std::vector<at::Tensor> views(const std::vector<at::Tensor>& buckets) const;

  // Copies the tensors of bucket `bucket` into dst[0, nbytes), casting each to its spec's dtype,
  // and zeroes the padding between entries. `tensors` holds one tensor per spec in spec order
  // (only this bucket's are read), each of exactly the spec's shape, on dst's device or the CPU.
  // dst: contiguous 1-D uint8 with at least the bucket's nbytes (a reused send buffer is fine).
  // Throws std::invalid_argument on a bad bucket index, count, shape or dst.
  void pack(const std::vector<at::Tensor>& tensors, int64_t bucket, at::Tensor& dst) const;

 private:
  WeightLayout() = default;

  std::vector<TensorSpec> specs_;
  std::vector<Bucket> buckets_;
  int64_t bucket_bytes_ = 0;
  int64_t alignment_ = 1;
  int64_t total_bytes_ = 0;
  int64_t max_bucket_nbytes_ = 0;
  uint64_t hash_ = 0;
};

// "name [d0, d1] dtype", as used in first_difference() messages.
std::string describe(const TensorSpec& spec);

}  // namespace crl::sync

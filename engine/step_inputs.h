// A step's model inputs in one host byte buffer, uploaded by ModelRunner with one asynchronous copy
// (pinned on a GPU): token ids, positions, cache slots, the rows that sample and the copy-on-write
// block pairs (int64), then query starts, context lengths and block tables (int32), each section
// 8-byte aligned. Built on the host every step: `bench host-step` times it with the scheduler's
// work, without a model.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "engine/scheduler.h"
#include "kv/paged_attention.h"

namespace crl::engine {

// Where a step's metadata sits in one byte buffer: the int64 sections first (token ids, positions,
// cache slots, the rows that sample, copy-on-write block pairs), then the int32 ones (query
// starts, context lengths, block tables), each 8-byte aligned.
struct StepLayout {
  int64_t rows = 0, seqs = 0, samples = 0, pairs = 0, max_blocks = 1;
  int64_t tok = 0, pos = 0, slot = 0, sample = 0, pair = 0, qs = 0, cl = 0, bt = 0, bytes = 0;

  StepLayout(int64_t rows_, int64_t seqs_, int64_t samples_, int64_t pairs_, int64_t max_blocks_)
      : rows(rows_), seqs(seqs_), samples(samples_), pairs(pairs_), max_blocks(max_blocks_) {
    auto take = [this](int64_t count, int64_t size) {
      const int64_t off = bytes;
      bytes += (count * size + 7) / 8 * 8;
      return off;
    };
    tok = take(rows, 8);
    pos = take(rows, 8);
    slot = take(rows, 8);
    sample = take(samples, 8);
    pair = take(2 * pairs, 8);
    qs = take(seqs + 1, 4);
    cl = take(seqs, 4);
    bt = take(seqs * max_blocks, 4);
    bytes = std::max<int64_t>(bytes, 8);
  }
  // Section `off` of `buf` as `count` elements of `dtype`.
  static at::Tensor view(const at::Tensor& buf, int64_t off, int64_t count, at::ScalarType dtype) {
    return buf.narrow(0, off, count * static_cast<int64_t>(c10::elementSize(dtype))).view(dtype);
  }
  kv::PagedAttentionMetadata metadata(const at::Tensor& buf, int64_t max_q, int64_t max_ctx) const {
    kv::PagedAttentionMetadata meta;
    meta.slot_mapping = view(buf, slot, rows, at::kLong);
    meta.query_start = view(buf, qs, seqs + 1, at::kInt);
    meta.context_lens = view(buf, cl, seqs, at::kInt);
    meta.block_tables = view(buf, bt, seqs * max_blocks, at::kInt).view({seqs, max_blocks});
    meta.max_query_len = max_q;
    meta.max_context_len = max_ctx;
    return meta;
  }
};

// A host buffer for a step's metadata: pinned for a device, so the one upload is asynchronous (the
// caching host allocator keeps the block until the copy has run).
at::Tensor step_host_buffer(const StepLayout& layout, const at::Device& device);

struct Filled {
  int64_t max_q = 0, max_ctx = 0;
};

// Writes `batch` into `buf` laid out by `layout`; sequences past the batch's (up to layout.seqs)
// are padding: one row each at position 0, no cache slot (-1: the write skips it), one attended
// position in block 0 (finite, and discarded by the caller).
Filled fill_step(const SchedulerOutput& batch, int32_t block_size, const StepLayout& layout,
                 at::Tensor& buf);

}  // namespace crl::engine

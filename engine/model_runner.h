// ModelRunner: owns the paged KV cache tensor and runs the Transformer on a scheduled batch.
//
// Owns: kv_cache_ [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim] in the model's
// compute dtype and device. Builds the packed inputs of a SchedulerOutput (tokens, positions, slot
// mapping, block tables, query offsets), performs the scheduler's copy-on-write block copies and
// runs the forward with paged attention.
//
// Thread safety: only the engine thread calls it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/scheduler.h"

namespace crl::engine {

struct ForwardOutput {
  at::Tensor hidden;               // [T, hidden]: final-normed hidden state of every scheduled token
  std::vector<int64_t> row_start;  // first row of each ScheduledSeq in `hidden`
};

class ModelRunner {
 public:
  // REQUIRES: `model` outlives the runner.
  ModelRunner(const Transformer& model, int32_t block_size, int32_t num_blocks);
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Bytes of one KV block over all layers (K and V).
  static int64_t block_bytes(const ModelConfig& config, at::ScalarType dtype, int32_t block_size);

  ForwardOutput execute(const SchedulerOutput& batch);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t kv_cache_bytes() const { return kv_cache_.numel() * kv_cache_.element_size(); }
  const at::Tensor& kv_cache() const { return kv_cache_; }

 private:
  const Transformer& model_;
  int32_t block_size_;
  int32_t num_blocks_;
  at::Tensor kv_cache_;
};

}  // namespace crl::engine

// WeightBuffers: the engine's weights moved into sync buckets, so a weight update is received in
// place (docs/design.md §3): one collective per bucket writes straight into the live weights, with
// no staging copy and no per-tensor load call.
//
// Construction plans a sync::WeightLayout over the model's parameters (HF names and order, the
// engine's compute dtype), allocates the buckets on the model's device, copies the current weights
// in and rebinds every model parameter to its view of the buckets.
//
// Contract: bucket memory may be written only between two engine steps, by the engine thread, and
// the engine's version set afterwards (LlmEngine::set_weight_version) so prefix-cache entries made
// by the old weights are never reused. EngineLoop does both for updates from its weight source.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/lora.h"
#include "engine/model/tensor_parallel.h"
#include "sync/weight_layout.h"

namespace crl::engine {

class Transformer;

class WeightBuffers {
 public:
  // REQUIRES: `model` outlives this object. bucket_bytes: the sync bucket cap.
  WeightBuffers(Transformer& model, int64_t bucket_bytes);
  WeightBuffers(const WeightBuffers&) = delete;
  WeightBuffers& operator=(const WeightBuffers&) = delete;

  const sync::WeightLayout& layout() const { return layout_; }
  // Receive targets: one contiguous uint8 tensor per bucket of layout().buckets().
  std::vector<at::Tensor>& buckets() { return buckets_; }

 private:
  sync::WeightLayout layout_;
  std::vector<at::Tensor> buckets_;
};

// TpWeightLanding: weight updates into one shard of a tensor-parallel engine (docs/design.md §4).
// The sync layout is the whole model's (names, whole shapes, the engine's dtype: what every
// trainer sends, one collective per bucket as for a whole engine), so the trainers need not know
// how the engines split. Each bucket arrives whole in a staging buffer on the group's leader
// (WeightSource::receive_staged) and every rank of the group copies its slice of each tensor in it
// (tp_slice: q/k/v and gate/up rows, o/down columns, embedding and head vocabulary rows where
// the group divides them; norms whole) into its
// shard's parameters, in place. The shard's memory never holds the whole model; the staging buffer
// is one bucket. Same write contract as WeightBuffers.
class TpWeightLanding {
 public:
  // REQUIRES: `shard` (this rank's model) outlives this object. `full`: the whole model's config.
  // Throws std::invalid_argument naming the tensor when the shard's parameters are not `where`'s
  // slices of `full`'s.
  TpWeightLanding(const Transformer& shard, const ModelConfig& full, TpShard where,
                  int64_t bucket_bytes);
  TpWeightLanding(const TpWeightLanding&) = delete;
  TpWeightLanding& operator=(const TpWeightLanding&) = delete;

  const sync::WeightLayout& layout() const { return layout_; }
  // Bucket `bucket`'s bytes (contiguous uint8 of at least its nbytes, on any device) into the
  // shard's parameters.
  void land(int64_t bucket, const at::Tensor& bytes) const;

 private:
  sync::WeightLayout layout_;
  std::vector<at::Tensor> params_;  // the shard's parameter of each layout spec
  TpShard where_;
};

// TpLaneBoard: where the ranks of an in-process tensor-parallel group put their weight buckets
// when each keeps its shard in sync buckets of its own (LlmEngine::attach_weight_lanes), so the
// leader receives every rank's slices over its sync lane (sync::WeightSource::receive_lanes)
// straight into that rank's memory, between two steps, once every follower waits for a command
// (ModelRunner::quiesce_followers).
class TpLaneBoard {
 public:
  explicit TpLaneBoard(int size) : buckets_(static_cast<size_t>(size)) {}
  // Rank `rank`'s buckets: the handles are shared, so their memory outlives a rank that ends.
  void put(int rank, const std::vector<at::Tensor>& buckets);
  // Every rank's, by rank. Throws std::logic_error naming a rank that has not put its own.
  std::vector<std::vector<at::Tensor>> all() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<at::Tensor>> buckets_;
};

// LoraBuffers: a LoRA adapter's receive buckets, for RL that trains and syncs the adapter alone
// (issue 29). The adapter's tensors (lora_tensors order and PEFT names, in the engine's compute
// dtype) are planned into sync buckets; an update is received there in place, one collective per
// bucket, and then loaded into the adapter's slot (LoraSlots::load, which scales B): one
// adapter-sized copy, megabytes against the model's gigabytes. Same write contract as
// WeightBuffers.
class LoraBuffers {
 public:
  LoraBuffers(const LoraAdapter& initial, at::ScalarType dtype, at::Device device,
              int64_t bucket_bytes);
  LoraBuffers(const LoraBuffers&) = delete;
  LoraBuffers& operator=(const LoraBuffers&) = delete;

  const sync::WeightLayout& layout() const { return layout_; }
  std::vector<at::Tensor>& buckets() { return buckets_; }
  // The adapter whose A and B are views of the buckets (what the last receive wrote).
  const LoraAdapter& adapter() const { return adapter_; }

 private:
  sync::WeightLayout layout_;
  std::vector<at::Tensor> buckets_;
  LoraAdapter adapter_;
};

// The sync specs of tensors in `dtype` (their names and shapes).
std::vector<sync::TensorSpec> tensor_specs(const NamedTensors& tensors, at::ScalarType dtype);

// The sync specs of a model's parameters, in model_param_specs order, in the model's dtype.
std::vector<sync::TensorSpec> weight_specs(const Transformer& model);
// The same with every tensor in `dtype`: the trainer's view of the engine's layout (fp32 masters
// sent to a bf16 engine).
std::vector<sync::TensorSpec> weight_specs(const Transformer& model, at::ScalarType dtype);

}  // namespace crl::engine

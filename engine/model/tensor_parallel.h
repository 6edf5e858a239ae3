// Tensor-parallel shards of the Transformer (docs/design.md §4; Megatron's column/row split, as
// vLLM lays it out): rank r of a group of n keeps attention heads [r·H/n, (r+1)·H/n) and their KV
// heads, and columns [r·I/n, (r+1)·I/n) of the MLP's intermediate. q/k/v and gate/up are split by
// output rows (column-parallel: no communication), o_proj and down_proj by input columns
// (row-parallel: each rank's product is a partial sum, all-reduced over the group before the
// residual add). Embedding, norms and the LM head stay whole on every rank. A shard is then an
// ordinary Transformer of the local config below: the same code, the same kernels, a KV pool of
// H_kv/n heads.
//
// Thread safety: pure functions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "engine/model/config.h"

namespace crl::engine {

struct TpShard {
  int64_t rank = 0;
  int64_t size = 1;
};

// The config a shard runs: attention heads, KV heads and the intermediate size divided by
// shard.size (head_dim unchanged). Throws std::invalid_argument naming the number that does not
// divide (KV heads are not replicated across ranks: a group larger than the KV heads is refused).
ModelConfig tp_local_config(const ModelConfig& full, const TpShard& shard);

// How parameter `name` (a model_param_specs name) is split: 0 by rows, 1 by columns, -1 whole.
int tp_split_dim(const std::string& name);

// `full` (the whole parameter) narrowed to `shard`'s part, contiguous; the tensor itself when the
// parameter is whole on every rank. tp_slice_view: the same part as a view of `full` (no copy).
at::Tensor tp_slice(const std::string& name, const at::Tensor& full, const TpShard& shard);
at::Tensor tp_slice_view(const std::string& name, const at::Tensor& full, const TpShard& shard);

}  // namespace crl::engine

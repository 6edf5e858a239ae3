// Tensor-parallel shards of the Transformer (docs/design.md §4; Megatron's column/row split, as
// vLLM lays it out): rank r of a group of n keeps attention heads [r·H/n, (r+1)·H/n) and their KV
// heads, and columns [r·I/n, (r+1)·I/n) of the MLP's intermediate. q/k/v and gate/up are split by
// output rows (column-parallel: no communication), o_proj and down_proj by input columns
// (row-parallel: each rank's product is a partial sum, all-reduced over the group before the
// residual add). The embedding and the LM head are split by vocabulary rows when n divides the
// vocabulary (vLLM's VocabParallelEmbedding and ParallelLMHead): rank r keeps rows
// [r·V/n, (r+1)·V/n); its embedding gives zeros for the other rows' tokens and the group's sum
// completes each token's row, and its head gives that part of the logits, which the engine
// gathers. A vocabulary n does not divide stays whole on every rank, as do the norms. A shard is
// then an ordinary Transformer of the local config below (vocab_size stays the whole model's; the
// shard's embedding and head rows are its VocabRange): the same code, the same kernels, a KV pool
// of H_kv/n heads.
//
// Thread safety: pure functions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

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

// The vocabulary rows a shard's embedding and LM head keep: [start, start + rows).
struct VocabRange {
  int64_t start = 0;
  int64_t rows = 0;
};

// Whether a group of `group_size` ranks splits a vocabulary of `vocab_size` entries (it divides).
bool tp_splits_vocab(int64_t vocab_size, int64_t group_size);
// `shard`'s rows of the full model's vocabulary: all of them when the group does not split it.
VocabRange tp_vocab_range(const ModelConfig& full, const TpShard& shard);

// How parameter `name` (a model_param_specs name of `full`) is split over a group of `group_size`:
// 0 by rows, 1 by columns, -1 whole.
int tp_split_dim(const std::string& name, const ModelConfig& full, int64_t group_size);

// `full` (the whole parameter) narrowed to `shard`'s part, contiguous; the tensor itself when the
// parameter is whole on every rank (the embedding and head: when shard.size does not divide their
// rows, the vocabulary). tp_slice_view: the same part as a view of `full` (no copy).
at::Tensor tp_slice(const std::string& name, const at::Tensor& full, const TpShard& shard);
at::Tensor tp_slice_view(const std::string& name, const at::Tensor& full, const TpShard& shard);
// The shape of that part, from the whole parameter's shape alone (no tensor needed).
std::vector<int64_t> tp_slice_shape(const std::string& name, std::vector<int64_t> shape,
                                    const TpShard& shard);

}  // namespace crl::engine

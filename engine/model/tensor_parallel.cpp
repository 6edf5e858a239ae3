#include "engine/model/tensor_parallel.h"

#include <stdexcept>
#include <utility>

namespace crl::engine {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t divided(const char* what, int64_t value, const TpShard& shard) {
  if (value % shard.size != 0) {
    throw std::invalid_argument("tensor parallelism: the model's " + std::string(what) + " (" +
                                std::to_string(value) + ") is not divisible by the group size " +
                                std::to_string(shard.size) + " (--tp; --infer-tp in the RL job)");
  }
  return value / shard.size;
}

}  // namespace

ModelConfig tp_local_config(const ModelConfig& full, const TpShard& shard) {
  if (shard.size < 1 || shard.rank < 0 || shard.rank >= shard.size) {
    throw std::invalid_argument("tensor parallelism: rank " + std::to_string(shard.rank) +
                                " of a group of " + std::to_string(shard.size));
  }
  ModelConfig c = full;
  c.num_heads = divided("num_attention_heads", full.num_heads, shard);
  c.num_kv_heads = divided("num_key_value_heads", full.num_kv_heads, shard);
  c.intermediate_size = divided("intermediate_size", full.intermediate_size, shard);
  return c;
}

namespace {

bool is_vocab_param(const std::string& name) {
  return name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

// The split of `name`, whose vocabulary (for the embedding and head) has `vocab` rows.
int split_dim(const std::string& name, int64_t vocab, int64_t group_size) {
  if (is_vocab_param(name)) return tp_splits_vocab(vocab, group_size) ? 0 : -1;
  for (const char* rows :
       {".q_proj.weight", ".q_proj.bias", ".k_proj.weight", ".k_proj.bias", ".v_proj.weight",
        ".v_proj.bias", ".gate_proj.weight", ".up_proj.weight"}) {
    if (ends_with(name, rows)) return 0;
  }
  for (const char* cols : {".o_proj.weight", ".down_proj.weight"}) {
    if (ends_with(name, cols)) return 1;
  }
  return -1;
}

}  // namespace

bool tp_splits_vocab(int64_t vocab_size, int64_t group_size) {
  return group_size > 1 && vocab_size % group_size == 0;
}

VocabRange tp_vocab_range(const ModelConfig& full, const TpShard& shard) {
  if (!tp_splits_vocab(full.vocab_size, shard.size)) return {0, full.vocab_size};
  const int64_t rows = full.vocab_size / shard.size;
  return {shard.rank * rows, rows};
}

int tp_split_dim(const std::string& name, const ModelConfig& full, int64_t group_size) {
  return split_dim(name, full.vocab_size, group_size);
}

at::Tensor tp_slice(const std::string& name, const at::Tensor& full, const TpShard& shard) {
  const at::Tensor part = tp_slice_view(name, full, shard);
  // A copy: a view (rows are contiguous already) would keep the whole tensor's memory alive.
  return part.is_same(full) ? full : part.clone(at::MemoryFormat::Contiguous);
}

namespace {

// The dimension `shard`'s part of parameter `name` (of `shape`) splits and its length there;
// dim -1: whole.
std::pair<int, int64_t> slice_of(const std::string& name, at::IntArrayRef shape,
                                 const TpShard& shard) {
  if (shard.size == 1) return {-1, 0};
  const int dim = split_dim(name, shape.empty() ? 0 : shape[0], shard.size);
  if (dim < 0) return {-1, 0};
  const int64_t n = shape.at(dim);
  if (n % shard.size != 0) {
    throw std::invalid_argument("tensor parallelism: '" + name + "' has " + std::to_string(n) +
                                " along dimension " + std::to_string(dim) +
                                ", not divisible by the group size " + std::to_string(shard.size));
  }
  return {dim, n / shard.size};
}

}  // namespace

at::Tensor tp_slice_view(const std::string& name, const at::Tensor& full, const TpShard& shard) {
  const auto [dim, part] = slice_of(name, full.sizes(), shard);
  if (dim < 0) return full;
  return full.narrow(dim, shard.rank * part, part);
}

std::vector<int64_t> tp_slice_shape(const std::string& name, std::vector<int64_t> shape,
                                    const TpShard& shard) {
  const auto [dim, part] = slice_of(name, shape, shard);
  if (dim >= 0) shape[dim] = part;
  return shape;
}

}  // namespace crl::engine

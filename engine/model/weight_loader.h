// Loads a Hugging Face checkpoint directory into named tensors matching a list of ParamSpecs.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/config.h"

namespace crl::engine {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Reads <dir>/model.safetensors, or <dir>/model.safetensors.index.json and its shards, and returns
// one tensor per spec, in spec order, converted to `dtype` (CPU). Errors (std::runtime_error) name
// the file and tensor: a missing file, a bad index, a missing tensor, a shape mismatch, an
// unsupported stored dtype, a corrupt or truncated file, NaN or infinite values, and weights of
// more layers than the specs name (config.json's num_hidden_layers short of the checkpoint's).
// `part`, when given, maps each checked tensor (name, whole) to what is kept of it (a
// tensor-parallel shard's slice), so only one whole tensor is held at a time.
using PartFn = std::function<at::Tensor(const std::string& name, const at::Tensor& whole)>;
NamedTensors load_checkpoint(const std::string& dir, const std::vector<ParamSpec>& specs,
                             at::ScalarType dtype, const PartFn& part = {});

// Writes named tensors as <dir>/model.safetensors (or, when max_shard_bytes > 0 and they do not fit
// one shard, as model-0000k-of-0000n.safetensors plus model.safetensors.index.json). Atomic per
// file.
void save_checkpoint(const std::string& dir, const NamedTensors& tensors,
                     int64_t max_shard_bytes = 0);

}  // namespace crl::engine

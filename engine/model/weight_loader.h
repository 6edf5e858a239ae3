// Loads a Hugging Face checkpoint directory into named tensors matching a list of ParamSpecs.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/config.h"

namespace crl::engine {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class SafetensorsFile;

// A checkpoint directory opened for reading its tensors, whole or by element range, one at a time:
// <dir>/model.safetensors, or <dir>/model.safetensors.index.json and its shards, mapped (a reader
// that takes only its ranges, as a ZeRO-3 rank does, never holds the whole model). Opening checks
// the structure, reading the values; errors (std::runtime_error) name the file and tensor: a
// missing file, a bad index, a missing tensor, a shape mismatch, an unsupported stored dtype, a
// corrupt or truncated file, weights of more layers than the specs name (config.json's
// num_hidden_layers short of the checkpoint's), and NaN or infinite values in what is read.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& dir, std::vector<ParamSpec> specs);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // Spec i whole (its shape), or its elements [from, from + count) in row-major order (1-D),
  // converted to `dtype`, on the CPU.
  at::Tensor load(size_t i, at::ScalarType dtype) const;
  at::Tensor load_range(size_t i, int64_t from, int64_t count, at::ScalarType dtype) const;
  // Elements returned so far.
  int64_t elements_read() const { return elements_read_; }

 private:
  at::Tensor checked(size_t i, at::Tensor t, int64_t from) const;

  std::vector<ParamSpec> specs_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<size_t> file_of_;  // spec -> files_ index
  mutable int64_t elements_read_ = 0;
};

// One tensor per spec, in spec order, converted to `dtype` (CPU), through a CheckpointReader (its
// errors).
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

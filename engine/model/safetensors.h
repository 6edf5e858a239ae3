// Safetensors reading (mmap, validated) and writing (atomic), our own implementation.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data region; offsets are relative to the data region.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crl::engine {

class SafetensorsFile {
 public:
  struct TensorInfo {
    std::string dtype;  // "F32", "BF16", "F16", "I64", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets into the data region
    uint64_t end = 0;
  };

  // Maps and validates the file: header length within the file, valid JSON, known dtypes, offsets
  // in bounds, byte count == numel * element size, no overlapping tensors. Throws
  // std::runtime_error whose message names the file (and the tensor where one is at fault).
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  // Copies tensor `name` out of the mapping, converted to `dtype` (F32/BF16/F16 convert among each
  // other). Throws std::runtime_error naming file and tensor when absent or not convertible.
  at::Tensor load(const std::string& name, at::ScalarType dtype) const;
  // Elements [from, from + count) of tensor `name` in row-major order, as a 1-D tensor of `dtype`
  // (a sharded reader takes its slice without the whole tensor). Throws as load(), and when the
  // range is outside the tensor.
  at::Tensor load_range(const std::string& name, int64_t from, int64_t count,
                        at::ScalarType dtype) const;

 private:
  SafetensorsFile() = default;
  at::Tensor read(const std::string& name, const TensorInfo& info, int64_t from,
                  std::vector<int64_t> shape, at::ScalarType dtype) const;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data region
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any CPU/CUDA tensors; stored contiguous in their own dtype) to `path`,
// atomically: a temp file in the same directory, fsync, then rename. Throws std::runtime_error.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Safetensors dtype string for a scalar type ("F32", "BF16", "F16", "I64", "I32", ...).
std::string safetensors_dtype(at::ScalarType dtype);

}  // namespace crl::engine

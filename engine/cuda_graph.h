// CudaGraph: a captured run of device work, replayed with one launch (CUDA builds only:
// engine/cuda_graph.cu; elsewhere capture_cuda_graph throws). ModelRunner uses it for decode
// steps (EngineConfig::cuda_graphs): one graph per batch-size bucket, replayed over static input
// buffers, which removes the per-operator launch cost of a forward.
//
// Contract of the captured function: it reads only device memory that outlives the graph (the
// weights, the KV cache, the static inputs) and makes no host-device synchronisation; its output
// lives in the graph's memory pool and is overwritten by every replay.
//
// Thread safety: one thread (the engine thread) captures and replays.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace crl::engine {

class CudaGraph {
 public:
  virtual ~CudaGraph() = default;
  // Replays the captured work on the current stream of the graph's device.
  virtual void replay() = 0;
  // The captured function's output (valid until the next replay).
  virtual const at::Tensor& output() const = 0;
};

// Runs `fn` once on a side stream of `device` (warm-up: cuBLAS handles, workspaces), then
// captures a second run. Graphs captured with `share_pool` set reuse that graph's memory pool
// (they must never replay concurrently). Throws std::runtime_error in builds without CUDA.
std::unique_ptr<CudaGraph> capture_cuda_graph(const std::function<at::Tensor()>& fn,
                                              const at::Device& device,
                                              const CudaGraph* share_pool = nullptr);

// Hands the memory libtorch's caching allocator holds unused on `device` back to the driver, so
// another process on the GPU (a colocated trainer or engine) can allocate it. Nothing on the CPU
// (freed host tensors are already returned).
void release_cached_device_memory(const at::Device& device);

// Copies `rows` rows of `row_bytes` each from the pinned host tensor `src` (from byte `src_offset`,
// rows `src_pitch` bytes apart) into the device tensor `dst` (from byte `dst_offset`, rows
// `dst_pitch` apart), asynchronously on the current stream; `src`'s pinned block is kept until the
// copy has run. A decode graph's static block table is `dst_pitch` wide (the longest context) while
// a step uses a few columns: only those travel. Throws std::runtime_error in builds without CUDA.
void copy_rows_to_device(at::Tensor& dst, int64_t dst_offset, int64_t dst_pitch,
                         const at::Tensor& src, int64_t src_offset, int64_t src_pitch,
                         int64_t row_bytes, int64_t rows);

}  // namespace crl::engine

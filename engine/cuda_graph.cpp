// Builds without CUDA: capture_cuda_graph says so (the CUDA build compiles cuda_graph.cu instead).
#ifndef CRL_WITH_CUDA
#include "engine/cuda_graph.h"

#include <stdexcept>

namespace crl::engine {

std::unique_ptr<CudaGraph> capture_cuda_graph(const std::function<at::Tensor()>&, const at::Device&,
                                              const CudaGraph*) {
  throw std::runtime_error(
      "CUDA graphs need a CUDA build (this colocated-rl was built without CUDA)");
}

void release_cached_device_memory(const at::Device& device) {
  if (device.is_cuda()) {
    throw std::runtime_error("release_cached_device_memory: a CUDA device in a build without CUDA");
  }
}

void copy_rows_to_device(at::Tensor&, int64_t, int64_t, const at::Tensor&, int64_t, int64_t,
                         int64_t, int64_t) {
  throw std::runtime_error("copy_rows_to_device needs a CUDA build");
}

}  // namespace crl::engine
#endif

// CUDA graph capture and replay through libtorch's at::cuda::CUDAGraph (contract in cuda_graph.h).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include "engine/cuda_graph.h"

namespace crl::engine {
namespace {

class LibtorchGraph : public CudaGraph {
 public:
  void replay() override { graph_.replay(); }
  const at::Tensor& output() const override { return output_; }

  mutable at::cuda::CUDAGraph graph_;  // pool() is not const
  at::Tensor output_;
};

}  // namespace

std::unique_ptr<CudaGraph> capture_cuda_graph(const std::function<at::Tensor()>& fn,
                                              const at::Device& device,
                                              const CudaGraph* share_pool) {
  const c10::cuda::CUDAGuard device_guard(device);
  auto g = std::make_unique<LibtorchGraph>();
  // Work queued on the current stream (the static inputs' upload) lands before the capture.
  at::cuda::getCurrentCUDAStream().synchronize();
  at::cuda::CUDAStream stream =
      at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  {
    const at::cuda::CUDAStreamGuard stream_guard(stream);
    fn();
    stream.synchronize();
    if (share_pool != nullptr) {
      g->graph_.capture_begin(static_cast<const LibtorchGraph*>(share_pool)->graph_.pool());
    } else {
      g->graph_.capture_begin();
    }
    g->output_ = fn();
    g->graph_.capture_end();
  }
  stream.synchronize();
  return g;
}

}  // namespace crl::engine

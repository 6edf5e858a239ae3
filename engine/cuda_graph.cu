// CUDA graph capture and replay through libtorch's at::cuda::CUDAGraph (contract in cuda_graph.h).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
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

void release_cached_device_memory(const at::Device& device) {
  if (!device.is_cuda()) return;
  const c10::cuda::CUDAGuard device_guard(device);
  // The memory's last users are queued on the streams: let them finish before the blocks go.
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  c10::cuda::CUDACachingAllocator::emptyCache();
}

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

void copy_rows_to_device(at::Tensor& dst, int64_t dst_offset, int64_t dst_pitch,
                         const at::Tensor& src, int64_t src_offset, int64_t src_pitch,
                         int64_t row_bytes, int64_t rows) {
  TORCH_CHECK(dst.is_cuda() && src.is_pinned(), "copy_rows_to_device: pinned host to CUDA only");
  TORCH_CHECK(row_bytes <= src_pitch && row_bytes <= dst_pitch &&
                  src_offset + rows * src_pitch <= src.nbytes() &&
                  dst_offset + rows * dst_pitch <= dst.nbytes(),
              "copy_rows_to_device: rows outside the tensors");
  if (rows == 0 || row_bytes == 0) return;
  const c10::cuda::CUDAGuard device_guard(dst.device());
  const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemcpy2DAsync(
      static_cast<uint8_t*>(dst.data_ptr()) + dst_offset, static_cast<size_t>(dst_pitch),
      static_cast<const uint8_t*>(src.data_ptr()) + src_offset, static_cast<size_t>(src_pitch),
      static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream));
  // The caching host allocator reuses the pinned block only once this copy has run.
  at::getHostAllocator(at::kCUDA)->record_event(
      src.storage().data_ptr().get(), src.storage().data_ptr().get_context(), stream.unwrap());
}

}  // namespace crl::engine

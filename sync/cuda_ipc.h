// CUDA pieces of the weight sync, loaded at run time: same-GPU bucket hand-over over CUDA IPC
// (SyncTransport::kIpc) and the device facts the transport is chosen by (sync/sync_transport.h).
//
// Built wherever cuda_runtime_api.h and cuda.h are found (this CPU machine included); libcudart and
// libcuda.so.1 are dlopen'ed on first use (a copy libtorch already loaded wins), so nothing is
// linked and the binary still starts without CUDA. Every entry point throws std::runtime_error
// naming why when CUDA is not usable (no runtime, no device, or a build without the headers).
//
// CUDA IPC facts the implementation relies on: cudaIpcGetMemHandle names a whole cudaMalloc
// allocation (so a tensor inside a caching-allocator block is exported as the handle of its
// allocation's base, found with cuMemGetAddressRange, plus its offset); cudaIpcOpenMemHandle maps
// that allocation's base in another process, with the same device current, and never in the
// process that exported it; an opened handle is closed (cudaIpcCloseMemHandle) at destruction.
// Memory from PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
// is not a cudaMalloc allocation and cannot be exported this way: the error says so.
#pragma once

#include <memory>
#include <string>

#include "sync/bucket_ipc.h"

namespace crl::sync {

// True when this build has the CUDA runtime headers and libcudart + a CUDA device load.
bool cuda_runtime_available(std::string* why_not = nullptr);
// CUDA devices visible to this process; 0 without a usable runtime.
int cuda_device_count();

struct CudaDeviceInfo {
  int index = -1;          // device ordinal in this process
  std::string uuid;        // "GPU-5e1c..." (MIG-aware, cuDeviceGetUuid_v2); empty when unknown
  std::string pci_bus_id;  // "0000:3b:00.0"
};
// Facts of device `index` (-1: the current device).
CudaDeviceInfo cuda_device_info(int index);
// Device `index`'s memory in bytes (cuDeviceTotalMem: no context is created, so a launcher can ask
// without taking GPU memory).
int64_t cuda_device_total_bytes(int index);

// Blocks until all work on device `index` finished (cudaDeviceSynchronize): for timing.
void cuda_synchronize_device(int index);

// CUDA IPC on device `device` (sender and receiver side alike); its copies run on a stream of its
// own that first waits for the legacy default stream (libtorch's current stream).
std::unique_ptr<IpcMemory> make_cuda_ipc_memory(int device);

}  // namespace crl::sync

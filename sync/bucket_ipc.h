// IpcMemory: hands bucket memory from a sender to receivers that share its memory space
// (SyncTransport::kIpc, docs/design.md §3). The sender names a region of its memory
// (export_region); every receiver copies that region into its own bucket (copy_async), one copy per
// region. The protocol around it (store keys, acknowledgements, deadlines) is WeightSync's
// (sync/weight_sync_ipc.cpp); this interface is only the memory side, so the protocol runs on CPU
// in tests over the host implementation below.
//
//   CUDA (sync/cuda_ipc.h)  ranks in different processes on one GPU: cudaIpcGetMemHandle of the
//                           allocation holding the bucket + the bucket's offset in it; the receiver
//                           opens each handle once (cached until destruction) and copies device to
//                           device on a stream of its own; or the sender opens the receiver's
//                           bucket and casts into it (open_region).
//   host (below)            ranks that are threads of one process (tests): the address itself.
//
// Thread safety: one thread uses an IpcMemory (the rank's sync thread).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace crl::sync {

// A region of a sender's memory, as a receiver needs it.
struct IpcRegion {
  std::string handle;  // opaque to the protocol (CUDA: the cudaIpcMemHandle_t's bytes)
  int64_t offset = 0;  // from the start of the allocation `handle` names
  int64_t bytes = 0;
  int64_t pid = 0;  // the exporting process
};

// A copy in flight.
class IpcCopy {
 public:
  virtual ~IpcCopy() = default;
  // Non-blocking: true once the copy completed. Throws std::runtime_error on a device error.
  virtual bool done() = 0;
};

class IpcMemory {
 public:
  virtual ~IpcMemory() = default;
  virtual const char* name() const = 0;  // "cuda-ipc", "host"

  // Sender, before publishing regions: true once every write queued so far to this rank's device
  // has finished (CUDA: libtorch's current stream, the legacy default stream, as in the NCCL
  // backend); false when `deadline` passed first. Throws std::runtime_error on a device error.
  virtual bool wait_writes(std::chrono::steady_clock::time_point deadline) = 0;
  // Sender: `t` (contiguous, on this rank's device) as a region. Throws std::runtime_error naming
  // why the memory cannot be exported.
  virtual IpcRegion export_region(const at::Tensor& t) = 0;
  // Receiver: starts one copy of `src` into `dst` (contiguous, src.bytes bytes, on this rank's
  // device), ordered after every write queued so far to dst's device. Throws std::runtime_error
  // naming why the region cannot be opened or copied.
  virtual std::unique_ptr<IpcCopy> copy_async(const IpcRegion& src, const at::Tensor& dst) = 0;
  // Sender writing into a receiver's memory (WeightSyncOptions::ipc_push): `region`, exported by
  // another rank, as a tensor of region.bytes bytes (kByte, on this rank's device) that this
  // process writes in place; valid while this object lives and the exporter keeps the memory.
  // Throws std::runtime_error naming why the region cannot be opened, or when it does not lie
  // inside the allocation it names.
  virtual at::Tensor open_region(const IpcRegion& region) = 0;
};

// Ranks as threads of one process (tests): regions are addresses, copies are memcpy. A region
// from another process is refused.
std::unique_ptr<IpcMemory> make_host_ipc_memory();

// Region <-> text for the store: the handle as hex.
std::string encode_handle(const std::string& bytes);
std::string decode_handle(const std::string& hex);  // throws std::invalid_argument on bad hex

}  // namespace crl::sync

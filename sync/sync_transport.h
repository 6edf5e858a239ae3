// SyncTransport: how the weight buckets of one sync_root group move (docs/design.md §3), chosen
// once at WeightSync setup from where every member's buckets live.
//
//   communicator  one broadcast per bucket over the group: NCCL between distinct GPUs, Gloo on CPU.
//   ipc           the members share one memory space: an engine and a trainer on the same GPU (the
//                 colocation case NCCL cannot serve: it refuses two ranks on one device). The
//                 sender exports each bucket's memory, every receiver copies it into its live
//                 weight bucket with one device-to-device copy (sync/bucket_ipc.h,
//                 sync/cuda_ipc.h).
//
// select_transport() is a pure function of the members' DeviceIdentity, so the rule is unit-tested
// on CPU; identify_device() builds this rank's identity (the CUDA part through sync/cuda_ipc.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crl::sync {

enum class SyncTransport { kAuto, kCommunicator, kIpc };
// "auto", "communicator", "ipc"; throws std::invalid_argument naming the text otherwise.
SyncTransport parse_sync_transport(const std::string& s);
const char* sync_transport_name(SyncTransport t);

// Where one rank's weight buckets live.
struct DeviceIdentity {
  std::string host;          // hostname
  int64_t pid = 0;           // the rank's process id
  std::string kind = "cpu";  // "cpu" or "cuda"
  std::string gpu;           // cuda: the GPU's UUID ("GPU-...", "MIG-..."), else its PCI bus id
  std::string pci;           // cuda: PCI bus id, e.g. "0000:3b:00.0" (for messages)
  int index = -1;            // cuda: the device ordinal in that process (for messages)

  bool is_cuda() const { return kind == "cuda"; }
  // One memory space: the same GPU of the same host (cuda), the same process (cpu).
  bool shares_memory_with(const DeviceIdentity& other) const;
  // "cuda:0 GPU-5e1c... (pci 0000:3b:00.0) on host-a", "cpu on host-a (pid 4711)".
  std::string describe() const;
  std::string to_json() const;
  // Throws std::invalid_argument on malformed text.
  static DeviceIdentity from_json(const std::string& text);
};

// This process's identity for buckets on `device` (cuda without an index: the current device).
// Throws std::runtime_error when `device` is CUDA and the CUDA runtime cannot be loaded.
DeviceIdentity identify_device(const at::Device& device);

struct SyncMember {
  std::string who;  // e.g. "rank 1 (node 0, train 0)"
  DeviceIdentity device;
};

// The transport of one group; every member computes the same answer from the same inputs.
//   requested communicator                        -> communicator
//   every member on CUDA, all on one GPU          -> ipc
//   every member on CUDA, no two on one GPU       -> communicator (requested ipc: error)
//   every member on CPU                           -> communicator; requested ipc: ipc when all
//                                                    are one process (ranks as threads: tests),
//                                                    an error otherwise
//   anything else (some members share a GPU and others do not, or CPU and CUDA mixed): an error.
// Errors are std::runtime_error "weight sync group GROUP: ...", naming every member and its device.
SyncTransport select_transport(SyncTransport requested, const std::string& group,
                               const std::vector<SyncMember>& members);

}  // namespace crl::sync

// NCCL backend of Communicator: the raw NCCL API on CUDA tensors (docs/design.md §2).
//
// Built wherever nccl.h and cuda_runtime.h are found; libnccl and libcudart are loaded at run
// time (dlopen), so one binary runs on machines with and without them. The unique id travels
// through the store; communicators are created non-blocking (ncclCommInitRankConfig with
// blocking = 0) and split with ncclCommSplit, every op is enqueued on the communicator's own
// stream and polled (cudaStreamQuery + ncclCommGetAsyncError) until its deadline; on expiry or an
// asynchronous error the communicator is ncclCommAbort'ed and CollectiveError names the op.
#pragma once

#include <memory>
#include <string>

#include "sync/communicator.h"
#include "sync/store.h"

namespace crl::sync {

// True when this build has the NCCL backend and libnccl + a CUDA device can be loaded.
bool nccl_available(std::string* why_not = nullptr);

// Makes device (local_rank mod the device count) current for this process; returns it.
int select_cuda_device(int local_rank);

// "gloo" or "nccl" for --comm-backend: "auto" is nccl when the tensors live on CUDA and NCCL is
// usable, gloo otherwise. An explicit "nccl" that cannot work is an error naming why.
// ranks_share_gpu: some ranks of a node share a GPU (fewer devices than ranks), which NCCL cannot
// serve; "auto" is then gloo (CUDA weights move over CUDA IPC, sync/sync_transport.h) and "nccl"
// an error.
std::string resolve_comm_backend(const std::string& requested, bool cuda_tensors,
                                 bool ranks_share_gpu = false);

// Every member calls it with the same `prefix` and its own `info`; uses the current CUDA device.
// Throws CollectiveError when NCCL is unavailable or the group cannot form before the deadline.
std::unique_ptr<Communicator> make_nccl_communicator(const StorePtr& store,
                                                     const std::string& prefix, GroupInfo info);

}  // namespace crl::sync

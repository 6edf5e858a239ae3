// Gloo backend of Communicator: libtorch's c10d ProcessGroupGloo on CPU tensors (docs/design.md
// §2), and on CUDA tensors where a CUDA libtorch stages them through host memory (a group whose
// members share one GPU, where NCCL cannot run; see sync/placement.h): a completed op's result is
// then ordered before the caller's current CUDA stream.
//
// Gloo has no bfloat16 and no abort: callers send raw bytes (uint8 views) and, after a
// CollectiveError, the rank exits. The deadline is both Gloo's own context timeout and a poll in
// Work::wait, so no op outlives the communicator's timeout by more than a poll interval.
#pragma once

#include <memory>
#include <string>

#include "sync/communicator.h"
#include "sync/store.h"

namespace crl::sync {

// Creates the group's communicator; every member calls it with the same `prefix` (a namespace in
// the store, unique per group) and `info` (its own rank). Blocks until all members connected or
// throws CollectiveError (op=connect) at the deadline. `bind_addr`: the local address Gloo listens
// on ("" = resolve this host's name; GLOO_SOCKET_IFNAME, when set, wins).
std::unique_ptr<Communicator> make_gloo_communicator(const StorePtr& store,
                                                     const std::string& prefix, GroupInfo info,
                                                     const std::string& bind_addr);

}  // namespace crl::sync

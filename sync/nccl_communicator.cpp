#include "sync/nccl_communicator.h"

#include <fmt/format.h>

#if !defined(CRL_WITH_NCCL)

namespace crl::sync {

bool nccl_available(std::string* why_not) {
  if (why_not) *why_not = "this build has no NCCL backend (nccl.h or cuda_runtime.h not found)";
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(const StorePtr&, const std::string& prefix,
                                                     GroupInfo info) {
  throw CollectiveError(fmt::format(
      "group {}: this build has no NCCL backend (nccl.h or cuda_runtime.h not found); use gloo",
      info.name));
}

}  // namespace crl::sync

#else
#include "sync/nccl_backend.inc"
#endif

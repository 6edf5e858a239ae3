#include "sync/nccl_communicator.h"

#include <fmt/format.h>

#include <cstring>

namespace crl::sync {

std::string resolve_comm_backend(const std::string& requested, bool cuda_tensors,
                                 bool ranks_share_gpu) {
  if (cuda_tensors && ranks_share_gpu) {
    if (requested == "nccl") {
      throw std::invalid_argument(
          "--comm-backend nccl: ranks of this node share a GPU and NCCL cannot hold two ranks on "
          "one device; use auto (Gloo, with weight updates over CUDA IPC)");
    }
    if (requested != "auto" && requested != "gloo") {
      throw std::invalid_argument("--comm-backend must be auto, gloo or nccl, got '" + requested +
                                  "'");
    }
    return "gloo";
  }
  if (requested == "gloo") {
    if (cuda_tensors) {
      throw std::invalid_argument("--comm-backend gloo moves CPU tensors; the weights are on CUDA");
    }
    return "gloo";
  }
  std::string why;
  bool nccl = cuda_tensors && nccl_available(&why);
  if (requested == "nccl") {
    if (!cuda_tensors) throw std::invalid_argument("--comm-backend nccl needs --device cuda");
    if (!nccl) throw std::invalid_argument("--comm-backend nccl: " + why);
    return "nccl";
  }
  if (requested != "auto") {
    throw std::invalid_argument("--comm-backend must be auto, gloo or nccl, got '" + requested +
                                "'");
  }
  if (cuda_tensors && !nccl) {
    throw std::invalid_argument("weights on CUDA need NCCL, which is not usable here: " + why);
  }
  return nccl ? "nccl" : "gloo";
}

}  // namespace crl::sync

#if !defined(CRL_WITH_NCCL)

namespace crl::sync {

int select_cuda_device(int) {
  throw std::runtime_error("this build has no CUDA runtime support (cuda_runtime_api.h not found)");
}

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

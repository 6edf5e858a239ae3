#include "sync/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <exception>

namespace crl::sync {

std::string Communicator::describe_op(const std::string& op, int64_t bytes, int peer_or_root,
                                      const char* peer_label) const {
  std::string s = fmt::format("op={} group={} ({}) rank={}/{} (world {}) members=world{}", op,
                              info_.name, backend(), info_.rank, info_.size(),
                              info_.world_ranks.at(info_.rank), info_.world_ranks);
  if (peer_or_root >= 0 && peer_or_root < info_.size()) {
    s +=
        fmt::format(" {}={} (world {})", peer_label, peer_or_root, info_.world_ranks[peer_or_root]);
  }
  s += fmt::format(" bytes={} timeout={}ms", bytes, info_.timeout.count());
  return s;
}

namespace {
std::atomic<bool> g_process_failed{false};
}  // namespace

bool Communicator::process_failed() { return g_process_failed.load(); }

void Communicator::fail(const std::string& what, const std::string& op_description) {
  g_process_failed = true;
  aborted_ = true;
  abort_reason_ = what + ": " + op_description;
  throw CollectiveError(abort_reason_);
}

void Communicator::check_chunked(const std::string& op, const at::Tensor& big,
                                 const at::Tensor& small) const {
  const int64_t bytes = big.numel() * static_cast<int64_t>(big.element_size());
  if (!big.is_contiguous() || !small.is_contiguous() || big.scalar_type() != small.scalar_type() ||
      big.device() != small.device() || big.numel() != small.numel() * info_.size()) {
    throw CollectiveError(fmt::format(
        "{} needs contiguous tensors of one dtype and device, the larger holding {} chunks of the "
        "smaller's {} elements; got {} and {} elements ({} and {}): {}",
        op, info_.size(), small.numel(), big.numel(), small.numel(),
        c10::toString(big.scalar_type()), c10::toString(small.scalar_type()),
        describe_op(op, bytes)));
  }
}

void Communicator::begin_op(const std::string& op, int64_t bytes, int peer_or_root,
                            const char* peer_label) {
  if (aborted_) {
    throw CollectiveError(fmt::format("communicator was aborted ({}); refusing {}", abort_reason_,
                                      describe_op(op, bytes, peer_or_root, peer_label)));
  }
  if (peer_or_root >= info_.size() || peer_or_root < -1) {
    throw CollectiveError(fmt::format("{} rank {} is outside the group: {}", peer_label,
                                      peer_or_root, describe_op(op, bytes)));
  }
  op_count_++;
}

void wait_all(std::vector<std::unique_ptr<Work>>& works) {
  std::exception_ptr first;
  for (auto& w : works) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  works.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace crl::sync

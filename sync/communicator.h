// Communicator: collectives over a group of ranks, one interface for Gloo and NCCL (docs/design.md
// §2).
//
// Every operation has a deadline (the communicator's timeout). When an operation fails or its
// deadline passes, the communicator throws CollectiveError, whose message names the op, the group,
// this rank and its peers (group and world ranks) and the byte count, and marks itself aborted:
// every later call throws at once. A rank that gets a CollectiveError must exit non-zero (the
// other ranks' collectives are already broken); app/ does that for every subcommand.
//
// Groups are made from a parent with split() (MPI_Comm_split / ncclCommSplit semantics): every
// rank of the parent calls it, in the same order; ranks passing the same color >= 0 form one
// group ordered by (key, parent rank); a negative color returns nullptr.
//
// Async ops return a Work; the tensor must stay alive and untouched until wait() returns. Ops on
// one communicator run in issue order on every rank (the same order on all of them), so an op's
// deadline counts from when it can run: the later of its issue and the previous op's completion.
//
// After any CollectiveError in the process, communicators are never destroyed cleanly (a clean
// Gloo/NCCL teardown waits on the broken peers): their destructors leak or abort instead, so the
// rank reaches its exit at once.
//
// Thread safety: one thread issues ops on a communicator; different communicators may be used
// from different threads.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace crl::sync {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { kSum, kMin, kMax };

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op completes; throws CollectiveError on failure or deadline.
  virtual void wait() = 0;
};

// Which ranks a group holds and its deadline: shared by every backend for naming errors.
struct GroupInfo {
  std::string name;              // e.g. "world", "train", "sync.node0.root1"
  int rank = 0;                  // this rank within the group
  std::vector<int> world_ranks;  // world rank of each member, by group rank
  std::chrono::milliseconds timeout{0};
  int size() const { return static_cast<int>(world_ranks.size()); }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;  // "gloo" or "nccl"

  const GroupInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  int rank() const { return info_.rank; }
  int size() const { return info_.size(); }
  std::chrono::milliseconds timeout() const { return info_.timeout; }
  bool aborted() const { return aborted_; }
  // Collectives issued so far (every op, barrier included): for tests and benches.
  int64_t op_count() const { return op_count_; }

  // `tensor` must be contiguous on the backend's device. `root`, `peer`: group ranks.
  virtual std::unique_ptr<Work> broadcast_async(at::Tensor tensor, int root) = 0;
  virtual std::unique_ptr<Work> all_reduce_async(at::Tensor tensor, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> send_async(at::Tensor tensor, int peer) = 0;
  virtual std::unique_ptr<Work> recv_async(at::Tensor tensor, int peer) = 0;
  // SUM over the group of chunk `rank()` of every rank's `input` into `output`: input holds size()
  // equal chunks of output.numel() elements (same dtype). `input` is scratch: its contents after
  // the op are unspecified (Gloo reduces it in place).
  virtual std::unique_ptr<Work> reduce_scatter_async(at::Tensor input, at::Tensor output) = 0;
  // Chunk r of `output` (size() equal chunks of input.numel() elements) becomes rank r's `input`.
  // `input` may be this rank's own chunk of `output` (in place).
  virtual std::unique_ptr<Work> all_gather_async(at::Tensor input, at::Tensor output) = 0;
  virtual void barrier() = 0;
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  void broadcast(const at::Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void all_reduce(const at::Tensor& t, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(t, op)->wait();
  }
  void send(const at::Tensor& t, int peer) { send_async(t, peer)->wait(); }
  void recv(const at::Tensor& t, int peer) { recv_async(t, peer)->wait(); }
  void reduce_scatter(const at::Tensor& in, const at::Tensor& out) {
    reduce_scatter_async(in, out)->wait();
  }
  void all_gather(const at::Tensor& in, const at::Tensor& out) {
    all_gather_async(in, out)->wait();
  }

  // "op=broadcast group=sync.node0 rank=1/3 (world 5) peers=world[4,5,6] root=0 bytes=1024":
  // the context every error of this communicator carries.
  std::string describe_op(const std::string& op, int64_t bytes, int peer_or_root = -1,
                          const char* peer_label = "root") const;
  // Throws CollectiveError "<what>: <describe_op>" and marks the communicator aborted.
  [[noreturn]] void fail(const std::string& what, const std::string& op_description);

  // Deadline of an op issued at `issued`: timeout after the later of `issued` and the completion of
  // the previous op waited for. note_done() records a completion.
  std::chrono::steady_clock::time_point deadline_for(
      std::chrono::steady_clock::time_point issued) const {
    return std::max(issued, last_done_) + info_.timeout;
  }
  void note_done() { last_done_ = std::chrono::steady_clock::now(); }

  // True once any communicator of this process failed (see the class comment).
  static bool process_failed();

 protected:
  explicit Communicator(GroupInfo info) : info_(std::move(info)) {}
  // Throws if the communicator was aborted; counts the op.
  void begin_op(const std::string& op, int64_t bytes, int peer_or_root = -1,
                const char* peer_label = "root");
  // Throws CollectiveError (naming the op) unless `big` is contiguous, has `small`'s dtype and
  // device and size() times its elements: the shape contract of reduce_scatter and all_gather.
  void check_chunked(const std::string& op, const at::Tensor& big, const at::Tensor& small) const;

  GroupInfo info_;
  bool aborted_ = false;
  std::string abort_reason_;
  int64_t op_count_ = 0;
  std::chrono::steady_clock::time_point last_done_{};
};

// Waits for every work in order; the first failure propagates after the rest were waited for
// (or abandoned, if the communicator aborted).
void wait_all(std::vector<std::unique_ptr<Work>>& works);

}  // namespace crl::sync

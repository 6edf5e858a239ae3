// TpGroup: what a tensor-parallel engine group runs (docs/design.md §4), as the engine sees it.
// The narrow interface between the engine and sync/, like WeightSource: the engine's model
// all-reduces each attention and MLP block's partial output over it, and its leader (group rank 0)
// sends each step's inputs (a command and a byte payload) to the other ranks, which take them in
// order. Two kinds:
// - over a Communicator (make_tp_group): ranks in different processes; the leader's commands are
//   broadcasts, so a follower's wait for the next one has the communicator's deadline;
// - in one process (LocalTpHub): one thread per rank; commands go through memory and a follower
//   waits for the next one without a deadline (an idle server's engine sends nothing); the
//   all-reduces and gathers go through memory on the CPU (every rank sums the ranks' tensors in
//   rank order: the same bits on each; ~1 ms a call less than Gloo over the loopback device) and
//   over each rank's NCCL communicator on a GPU.
// Every collective keeps its communicator's deadline and the error naming the op, the group, the
// ranks and the bytes.
//
// Thread safety: one thread per rank issues ops on its TpGroup.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crl::sync {

class Communicator;

class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where all_reduce_sum's tensors must live (the CPU for Gloo, the rank's GPU for NCCL).
  virtual at::Device device() const = 0;
  virtual const std::string& name() const = 0;
  // In place: the element-wise sum over the group.
  virtual void all_reduce_sum(const at::Tensor& t) = 0;
  // The leader's `out` (contiguous, size() times `in`'s elements, on device()): chunk r becomes
  // rank r's `in`. The other ranks pass an undefined `out` and receive nothing (only the leader
  // samples from the logits).
  virtual void gather_to_leader(const at::Tensor& in, const at::Tensor& out) = 0;
  // The leader: sends `words` (at most kMaxWords) and `payload` (uint8 bytes on the CPU, or
  // undefined) to every other rank.
  virtual void lead(const std::vector<int64_t>& words, const at::Tensor& payload) = 0;
  // A follower: the leader's next words and payload (uint8 on the CPU; undefined when none), in
  // the order sent.
  virtual void next(std::vector<int64_t>* words, at::Tensor* payload) = 0;
  // Ends the group after a failure on this rank: in one process the other ranks' waits fail (or,
  // in next(), return no words) at once; over a Communicator nothing is sent (the others' next
  // collective fails at its deadline, and a rank that fails exits).
  virtual void abort() = 0;
  static constexpr int kMaxWords = 12;
};

// A TpGroup over `comm` (not owned; it must outlive the group) for an engine on `device`: its
// all-reduces run on `device` over NCCL, on the CPU over Gloo.
std::unique_ptr<TpGroup> make_tp_group(Communicator& comm, at::Device device);

// An in-process group of `size` ranks: each rank's thread calls join(rank, device); on GPUs at the
// same time (their NCCL communicators rendezvous over a TCP store on the loopback device, each on
// its thread's `device`). close() wakes the followers waiting in next() with an empty command list
// (a leader that gave up) and fails the all-reduces in progress.
class LocalTpHub {
 public:
  LocalTpHub(int size, std::chrono::milliseconds timeout);
  ~LocalTpHub();
  LocalTpHub(const LocalTpHub&) = delete;
  LocalTpHub& operator=(const LocalTpHub&) = delete;

  std::unique_ptr<TpGroup> join(int rank, at::Device device);
  void close();
  int size() const { return size_; }

  struct Channel;  // the leader's commands to one follower
  struct Reducer;  // the CPU all-reduce

 private:
  int size_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  int port_ = 0;
  struct Server;
  std::shared_ptr<Server> server_;                  // the store's listening side
  std::vector<std::shared_ptr<Channel>> channels_;  // by follower rank (index 0 unused)
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace crl::sync

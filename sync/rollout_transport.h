// Rollout transport (docs/design.md §5 step 3): packed micro-batches from a node's infer ranks to
// the same node's train ranks, over the node's sync group, with no central controller.
//
// A message is one contiguous uint8 tensor. The sender announces its size under a store key
// (per step, infer rank, train rank and sequence number), then posts one send; the receiver sees
// the key, posts the matching recv, and deletes the key. An "end" key closes a step's stream
// from one infer rank to one train rank. A train rank "opens" a step's streams when it starts
// receiving them, and a sender posts no send of a step to a train rank before that: a posted
// send then never waits out a train rank's previous step (training, a weight sync) against the
// communicator's deadline; the sender waits for the opening against its own, longer one (the
// rollout deadline). Every key of the protocol is spelled in rollout_transport.cpp only.
//
// RolloutSender (infer rank) sends from its own thread, so the caller never blocks on a train
// rank that is busy: enqueue() takes a message into a bounded queue or says it is full, and the
// caller decides what to do meanwhile (the RL producer applies weight updates and stops admitting
// prompts). Messages go round robin over the node's train ranks, starting at this infer rank's
// index, so small steps spread over all of them. Memory: at most `queue_capacity` queued plus
// `max_in_flight` posted messages.
//
// RolloutReceiver (train rank) takes one step's messages from every infer rank of the node, in
// each sender's order, and returns when every one of them ended the step.
//
// Thread safety: each object belongs to one thread (the sender's queue is internally locked).
// REQUIRES: the store handed to a RolloutSender is a connection no other thread uses.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sync/communicator.h"
#include "sync/store.h"

namespace crl::sync {

struct RolloutRoute {
  int node = 0;            // the node whose sync group carries the stream
  int infer_per_node = 1;  // sync group ranks [train_per_node, +infer_per_node) are infer ranks
  int train_per_node = 1;  // sync group ranks [0, train_per_node) are train ranks
};

class RolloutSender {
 public:
  // `infer_index`: this rank among its node's infer ranks. `comm`: the node's sync group.
  // `open_timeout`: how long a message may wait for its train rank to open its step.
  RolloutSender(StorePtr own_store, Communicator& comm, RolloutRoute route, int infer_index,
                std::chrono::milliseconds open_timeout, size_t queue_capacity = 4,
                size_t max_in_flight = 4);
  ~RolloutSender();  // stops the thread; messages not yet sent are dropped
  RolloutSender(const RolloutSender&) = delete;
  RolloutSender& operator=(const RolloutSender&) = delete;

  // Queues `bytes` as the next message of `step` to the next train rank; false when the queue is
  // full (nothing taken). Rethrows an error of the sending thread.
  bool try_enqueue(int64_t step, at::Tensor bytes);
  // Queues the end of `step` for every train rank of the node (never refused).
  void end_step(int64_t step);
  // True when every queued message was posted and every posted send completed. Rethrows an error
  // of the sending thread.
  bool idle();

 private:
  struct Message {
    int64_t step = 0;
    int train = 0;
    at::Tensor bytes;  // undefined: the end of the step
  };
  void run();
  // Returns once train rank `train` opened `step` (at once if it was seen open before); throws
  // naming both after open_timeout; false when the sender is stopping.
  bool wait_open(int64_t step, int train);
  std::string key(int64_t step, int train, int64_t seq) const;
  void rethrow();

  StorePtr store_;
  Communicator& comm_;
  const RolloutRoute route_;
  const int infer_index_;
  const std::chrono::milliseconds open_timeout_;
  const size_t capacity_;
  const size_t max_in_flight_;
  int64_t round_robin_ = 0;         // caller thread
  std::vector<int64_t> open_step_;  // sender thread: per train rank, the newest step seen open

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;  // guarded by mu_
  bool busy_ = false;          // guarded by mu_: the thread holds a message or unfinished sends
  bool stopping_ = false;      // guarded by mu_
  std::exception_ptr error_;   // guarded by mu_
  std::thread thread_;
};

class RolloutReceiver {
 public:
  // `train_index`: this rank among its node's train ranks. `comm`: the node's sync group.
  RolloutReceiver(StorePtr store, Communicator& comm, RolloutRoute route, int train_index);

  struct Stats {
    int64_t messages = 0;
    int64_t bytes = 0;
    double wait_s = 0;  // waiting for keys and inside recv
  };
  // Calls on_message(bytes) for every message of `step`, as they come, until every infer rank of
  // the node ended the step; on_idle (if set) whenever a poll found nothing new, before pausing
  // (its time is not counted as waiting). With `in_turn` the messages come in a fixed order
  // whatever their timing: one from each infer rank whose stream is open, in index order, round
  // after round (a late rank holds the others back). Throws std::runtime_error naming the infer
  // ranks (node-local index) still open at `deadline`.
  Stats receive_step(int64_t step, Clock::time_point deadline,
                     const std::function<void(at::Tensor)>& on_message,
                     const std::function<void()>& on_idle = nullptr, bool in_turn = false);

 private:
  StorePtr store_;
  Communicator& comm_;
  const RolloutRoute route_;
  const int train_index_;
  std::vector<int64_t> next_;  // next sequence number per infer rank (sequence numbers span steps)
};

}  // namespace crl::sync

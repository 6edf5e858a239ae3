#include "sync/rollout_transport.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/units.h"

namespace crl::sync {
namespace {

constexpr const char* kEnd = "end";

std::string message_key(const RolloutRoute& r, int64_t step, int infer, int train, int64_t seq) {
  return fmt::format("rl/mb/n{}/s{}/i{}/t{}/{}", r.node, step, infer, train, seq);
}

std::string open_key(const RolloutRoute& r, int64_t step, int train) {
  return fmt::format("rl/mb/n{}/s{}/t{}/open", r.node, step, train);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RolloutSender

RolloutSender::RolloutSender(StorePtr own_store, Communicator& comm, RolloutRoute route,
                             int infer_index, std::chrono::milliseconds open_timeout,
                             size_t queue_capacity, size_t max_in_flight)
    : store_(std::move(own_store)),
      comm_(comm),
      route_(route),
      infer_index_(infer_index),
      open_timeout_(open_timeout),
      capacity_(std::max<size_t>(1, queue_capacity)),
      max_in_flight_(std::max<size_t>(1, max_in_flight)),
      round_robin_(infer_index),
      open_step_(route.train_per_node, -1) {
  thread_ = std::thread([this] { run(); });
}

RolloutSender::~RolloutSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RolloutSender::rethrow() {
  if (error_) std::rethrow_exception(error_);
}

bool RolloutSender::try_enqueue(int64_t step, at::Tensor bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow();
  if (queue_.size() >= capacity_) return false;
  const int train = static_cast<int>(round_robin_++ % route_.train_per_node);
  queue_.push_back({step, train, std::move(bytes)});
  cv_.notify_all();
  return true;
}

void RolloutSender::end_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow();
  for (int t = 0; t < route_.train_per_node; ++t) queue_.push_back({step, t, at::Tensor()});
  cv_.notify_all();
}

bool RolloutSender::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow();
  return queue_.empty() && !busy_;
}

std::string RolloutSender::key(int64_t step, int train, int64_t seq) const {
  return message_key(route_, step, infer_index_, train, seq);
}

bool RolloutSender::wait_open(int64_t step, int train) {
  if (open_step_[train] >= step) return true;  // steps open in order
  const std::string k = open_key(route_, step, train);
  const auto deadline = Clock::now() + open_timeout_;
  auto pause = std::chrono::microseconds(100);
  while (!store_has(store_, k)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(fmt::format(
          "rollout transport: train rank {} of node {} did not start receiving step {} within {} s "
          "(infer rank {} of the node had its rollouts ready)",
          train, route_.node, step + 1, open_timeout_.count() / 1000, infer_index_));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  open_step_[train] = step;
  return true;
}

void RolloutSender::run() {
  std::deque<std::pair<std::unique_ptr<Work>, at::Tensor>> posted;  // kept alive until sent
  std::map<std::pair<int64_t, int>, int64_t> next_seq;              // (step, train) -> seq
  try {
    while (true) {
      Message m;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Idle with sends posted: finish them first so idle() can turn true.
        if (queue_.empty() && !posted.empty()) {
          lock.unlock();
          while (!posted.empty()) {
            posted.front().first->wait();
            posted.pop_front();
          }
          lock.lock();
        }
        if (queue_.empty()) busy_ = false;
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        m = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      int64_t& seq = next_seq[{m.step, m.train}];
      if (!m.bytes.defined()) {
        store_set(store_, key(m.step, m.train, seq), kEnd);
        next_seq.erase({m.step, m.train});
        continue;
      }
      if (!wait_open(m.step, m.train)) return;
      while (posted.size() >= max_in_flight_) {
        posted.front().first->wait();
        posted.pop_front();
      }
      // Announce the size, then one send: the train rank posts the matching recv when it sees it.
      store_set(store_, key(m.step, m.train, seq++), std::to_string(m.bytes.numel()));
      auto work = comm_.send_async(m.bytes, /*sync rank of train t=*/m.train);
      posted.emplace_back(std::move(work), std::move(m.bytes));
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    busy_ = false;
  }
}

// ---------------------------------------------------------------------------------------------
// RolloutReceiver

RolloutReceiver::RolloutReceiver(StorePtr store, Communicator& comm, RolloutRoute route,
                                 int train_index)
    : store_(std::move(store)), comm_(comm), route_(route), train_index_(train_index) {}

RolloutReceiver::Stats RolloutReceiver::receive_step(
    int64_t step, Clock::time_point deadline, const std::function<void(at::Tensor)>& on_message,
    const std::function<void()>& on_idle, bool in_turn) {
  const int infer = route_.infer_per_node;
  std::vector<int64_t> next(infer, 0);
  std::vector<bool> done(infer, false);
  int remaining = infer;
  int turn = 0;  // in_turn: the infer rank whose message comes next
  Stats st;
  store_set(store_, open_key(route_, step, train_index_), "1");
  // Takes infer rank i's next message (or end) if it was announced; false if not yet.
  auto take = [&](int i) {
    const std::string k = message_key(route_, step, i, train_index_, next[i]);
    if (!store_has(store_, k)) return false;
    const std::string val = store_get(store_, k, deadline, "rollout message");
    store_delete(store_, k);
    ++next[i];
    if (val == kEnd) {
      done[i] = true;
      --remaining;
      return true;
    }
    auto w0 = Clock::now();
    at::Tensor buf = at::empty({std::stoll(val)}, at::kByte);
    comm_.recv(buf, /*sync rank of infer i=*/route_.train_per_node + i);
    st.wait_s += seconds_since(w0);
    st.bytes += buf.numel();
    ++st.messages;
    on_message(std::move(buf));
    return true;
  };
  auto pause = std::chrono::microseconds(100);
  while (remaining > 0) {
    bool progressed = false;
    if (in_turn) {
      while (done[turn]) turn = (turn + 1) % infer;  // some stream is open: remaining > 0
      if (take(turn)) {
        progressed = true;
        turn = (turn + 1) % infer;
      }
    } else {
      for (int i = 0; i < infer; ++i) {
        if (!done[i] && take(i)) progressed = true;
      }
    }
    if (progressed || remaining == 0) {
      pause = std::chrono::microseconds(100);
      continue;
    }
    if (Clock::now() > deadline) {
      std::vector<int> open;
      for (int i = 0; i < infer; ++i) {
        if (!done[i]) open.push_back(i);
      }
      throw std::runtime_error(fmt::format(
          "step {}: no end of the rollout stream from infer ranks {} (node-local index) of node {} "
          "before the deadline",
          step + 1, fmt::join(open, ", "), route_.node));
    }
    if (on_idle) on_idle();
    auto p0 = Clock::now();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
    st.wait_s += seconds_since(p0);
  }
  // Every infer rank ended the step: none will look at the opening again.
  store_delete(store_, open_key(route_, step, train_index_));
  return st;
}

}  // namespace crl::sync

#include "sync/tp_group.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "sync/communicator.h"
#include "sync/nccl_communicator.h"
#include "sync/store.h"

namespace crl::sync {

namespace {

void check_words(const std::vector<int64_t>& words) {
  if (words.empty() || words.size() > static_cast<size_t>(TpGroup::kMaxWords)) {
    throw std::logic_error("TpGroup::lead: 1 to " + std::to_string(TpGroup::kMaxWords) +
                           " words, not " + std::to_string(words.size()));
  }
}

void check_gather_output(const TpGroup& g, const at::Tensor& in, const at::Tensor& out) {
  const bool leader = g.rank() == 0;
  if (leader != out.defined() ||
      (leader && (!out.is_contiguous() || out.numel() != in.numel() * g.size() ||
                  out.scalar_type() != in.scalar_type() || out.device() != in.device()))) {
    throw CollectiveError(
        "gather_to_leader on group " + g.name() + " (rank " + std::to_string(g.rank()) + " of " +
        std::to_string(g.size()) + ", " + std::to_string(in.numel() * in.element_size()) +
        " bytes a rank): the leader's output must be contiguous, " + std::to_string(g.size()) +
        " times the input's elements, of its dtype and device; the other ranks pass none");
  }
}

// Point to point: every other rank sends its part to rank 0, which receives each into its chunk
// (Gloo and NCCL alike; nothing reaches the other ranks, where an all-gather sends them all).
void gather_over(Communicator& comm, const at::Tensor& in, const at::Tensor& out) {
  const at::Tensor part = in.contiguous();
  if (comm.rank() != 0) {
    comm.send(part, 0);
    return;
  }
  const at::Tensor chunks = out.view({comm.size(), -1});
  chunks[0].copy_(part.view({-1}));
  std::vector<std::unique_ptr<Work>> works;
  for (int r = 1; r < comm.size(); ++r) works.push_back(comm.recv_async(chunks[r], r));
  wait_all(works);
}

// Commands as broadcasts from group rank 0: a fixed header [count, words..., payload bytes], then
// the payload.
class CommunicatorTpGroup : public TpGroup {
 public:
  CommunicatorTpGroup(Communicator& comm, at::Device device)
      : comm_(comm), device_(comm.backend() == "nccl" ? device : at::Device(at::kCPU)) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  at::Device device() const override { return device_; }
  const std::string& name() const override { return comm_.name(); }
  void all_reduce_sum(const at::Tensor& t) override { comm_.all_reduce(t, ReduceOp::kSum); }
  void gather_to_leader(const at::Tensor& in, const at::Tensor& out) override {
    check_gather_output(*this, in, out);
    gather_over(comm_, in, out);
  }
  void abort() override {}

  void lead(const std::vector<int64_t>& words, const at::Tensor& payload) override {
    check_words(words);
    std::vector<int64_t> header(kMaxWords + 2, 0);
    header[0] = static_cast<int64_t>(words.size());
    std::copy(words.begin(), words.end(), header.begin() + 1);
    header.back() = payload.defined() ? payload.numel() : 0;
    comm_.broadcast(at::tensor(header, at::kLong).to(device_), 0);
    if (header.back() > 0) comm_.broadcast(payload.to(device_), 0);
  }

  void next(std::vector<int64_t>* words, at::Tensor* payload) override {
    at::Tensor header = at::empty({kMaxWords + 2}, at::TensorOptions(at::kLong).device(device_));
    comm_.broadcast(header, 0);
    header = header.cpu();
    const int64_t* h = header.data_ptr<int64_t>();
    words->assign(h + 1, h + 1 + h[0]);
    const int64_t bytes = h[kMaxWords + 1];
    *payload = at::Tensor();
    if (bytes > 0) {
      at::Tensor p = at::empty({bytes}, at::TensorOptions(at::kByte).device(device_));
      comm_.broadcast(p, 0);
      *payload = p.cpu();
    }
  }

 private:
  Communicator& comm_;
  at::Device device_;
};

}  // namespace

std::unique_ptr<TpGroup> make_tp_group(Communicator& comm, at::Device device) {
  return std::make_unique<CommunicatorTpGroup>(comm, device);
}

struct LocalTpHub::Server {
  StorePtr store;
};

// The CPU all-reduce of an in-process group, through memory: every rank publishes its tensor, each
// sums all of them in rank order into its own (so every rank gets the same bits), between two
// barriers with the hub's deadline.
struct LocalTpHub::Reducer {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  bool broken = false;
  std::vector<at::Tensor> inputs;
};

struct LocalTpHub::Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::vector<int64_t>, at::Tensor>> queue;
  bool closed = false;
};

namespace {

void close_channels(std::vector<std::shared_ptr<LocalTpHub::Channel>>& channels,
                    LocalTpHub::Reducer& reducer) {
  {
    std::lock_guard<std::mutex> lock(reducer.mu);
    reducer.broken = true;
  }
  reducer.cv.notify_all();
  for (auto& c : channels) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->closed = true;
    }
    c->cv.notify_all();
  }
}

// Commands through memory: the leader appends to each follower's channel (the payload shared, not
// copied: the leader never writes a buffer it has sent). All-reduces through memory on the CPU,
// over the rank's NCCL communicator on a GPU.
class LocalTpGroup : public TpGroup {
 public:
  LocalTpGroup(int rank, int size, std::unique_ptr<Communicator> comm, at::Device device,
               std::vector<std::shared_ptr<LocalTpHub::Channel>> channels,
               std::shared_ptr<LocalTpHub::Reducer> reducer, std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        comm_(std::move(comm)),
        device_(device),
        channels_(std::move(channels)),
        reducer_(std::move(reducer)),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  at::Device device() const override { return device_; }
  const std::string& name() const override { return name_; }

  void all_reduce_sum(const at::Tensor& t) override {
    if (comm_) {
      const c10::DeviceGuard guard(device_);  // whichever thread steps the engine
      comm_->all_reduce(t, ReduceOp::kSum);
      return;
    }
    LocalTpHub::Reducer& r = *reducer_;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.inputs[rank_] = t;
    }
    barrier("all_reduce", t);
    at::Tensor sum;
    try {
      sum = r.inputs[0].clone();
      for (int i = 1; i < size_; ++i) sum.add_(r.inputs[i]);
    } catch (...) {
      abort();  // the others are on their way to the second barrier
      throw;
    }
    barrier("all_reduce", t);  // nobody reads the inputs any more
    t.copy_(sum);
  }

  void gather_to_leader(const at::Tensor& in, const at::Tensor& out) override {
    check_gather_output(*this, in, out);
    if (comm_) {
      const c10::DeviceGuard guard(device_);
      gather_over(*comm_, in, out);
      return;
    }
    LocalTpHub::Reducer& r = *reducer_;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.inputs[rank_] = in;
    }
    barrier("gather_to_leader", in);
    if (rank_ == 0) {
      try {
        const at::Tensor chunks = out.view({size_, -1});
        for (int i = 0; i < size_; ++i) chunks[i].copy_(r.inputs[i].reshape({-1}));
      } catch (...) {
        abort();
        throw;
      }
    }
    barrier("gather_to_leader", in);  // the followers' inputs are read
  }

  void abort() override { close_channels(channels_, *reducer_); }

  void lead(const std::vector<int64_t>& words, const at::Tensor& payload) override {
    check_words(words);
    const at::Tensor p = payload.defined() ? payload.cpu() : at::Tensor();
    for (int r = 1; r < size(); ++r) {
      LocalTpHub::Channel& c = *channels_[r];
      {
        std::lock_guard<std::mutex> lock(c.mu);
        c.queue.emplace_back(words, p);
      }
      c.cv.notify_one();
    }
  }

  void next(std::vector<int64_t>* words, at::Tensor* payload) override {
    LocalTpHub::Channel& c = *channels_[rank()];
    std::unique_lock<std::mutex> lock(c.mu);
    c.cv.wait(lock, [&] { return !c.queue.empty() || c.closed; });
    if (c.queue.empty()) {  // closed, nothing left
      words->clear();
      *payload = at::Tensor();
      return;
    }
    *words = std::move(c.queue.front().first);
    *payload = std::move(c.queue.front().second);
    c.queue.pop_front();
  }

 private:
  void barrier(const char* op, const at::Tensor& t) {
    LocalTpHub::Reducer& r = *reducer_;
    std::unique_lock<std::mutex> lock(r.mu);
    const int64_t gen = r.generation;
    if (!r.broken && ++r.arrived == size_) {
      r.arrived = 0;
      ++r.generation;
      r.cv.notify_all();
      return;
    }
    if (!r.cv.wait_for(lock, timeout_, [&] { return r.generation != gen || r.broken; }) ||
        r.generation == gen) {
      r.broken = true;
      r.cv.notify_all();
      throw CollectiveError(
          std::string(op) + " failed on group tp (in-process, rank " + std::to_string(rank_) +
          " of " + std::to_string(size_) + ", " + std::to_string(t.numel() * t.element_size()) +
          " bytes): " + std::to_string(size_ - r.arrived) + " rank(s) did not arrive within " +
          std::to_string(timeout_.count() / 1000.0) + " s (or one failed)");
    }
  }

  int rank_, size_;
  std::unique_ptr<Communicator> comm_;  // NCCL on a GPU; null on the CPU
  at::Device device_;
  std::vector<std::shared_ptr<LocalTpHub::Channel>> channels_;
  std::shared_ptr<LocalTpHub::Reducer> reducer_;
  std::chrono::milliseconds timeout_;
  std::string name_ = "tp";
};

}  // namespace

LocalTpHub::LocalTpHub(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {
  static std::atomic<int> hubs{0};
  prefix_ = "tp" + std::to_string(hubs++);
  for (int r = 0; r < size; ++r) channels_.push_back(std::make_shared<Channel>());
  reducer_ = std::make_shared<Reducer>();
  reducer_->inputs.resize(size);
}

LocalTpHub::~LocalTpHub() { close(); }

std::unique_ptr<TpGroup> LocalTpHub::join(int rank, at::Device device) {
  std::unique_ptr<Communicator> comm;
  if (device.is_cuda()) {
    GroupInfo info;
    info.name = "tp";
    info.rank = rank;
    info.timeout = timeout_;
    for (int i = 0; i < size_; ++i) info.world_ranks.push_back(i);
    {
      std::lock_guard<std::mutex> lock(reducer_->mu);  // the store: made once, by the first rank
      if (!server_) {
        server_ = std::make_shared<Server>(Server{host_store(0, timeout_)});
        port_ = store_port(server_->store);
        std::string why;
        if (!bind_store_to_loopback(server_->store, &why)) {
          spdlog::warn(
              "the tensor-parallel group's rendezvous store (no authentication) stays reachable "
              "from the network: cannot tie it to loopback ({})",
              why);
        }
      }
    }
    StorePtr store = connect_store("127.0.0.1", port_, timeout_);
    const c10::DeviceGuard guard(device);  // NCCL takes the calling thread's current device
    comm = make_nccl_communicator(store, prefix_, info);
  }
  return std::make_unique<LocalTpGroup>(rank, size_, std::move(comm), device, channels_, reducer_,
                                        timeout_);
}

void LocalTpHub::close() { close_channels(channels_, *reducer_); }

}  // namespace crl::sync

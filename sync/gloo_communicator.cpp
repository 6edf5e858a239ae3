#include "sync/gloo_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <utility>

namespace crl::sync {
namespace {

using Clock = std::chrono::steady_clock;

class GlooCommunicator;

class GlooWork : public Work {
 public:
  GlooWork(GlooCommunicator* comm, c10::intrusive_ptr<c10d::Work> work, std::string what,
           Clock::time_point issued, bool point_to_point)
      : comm_(comm),
        work_(std::move(work)),
        what_(std::move(what)),
        issued_(issued),
        point_to_point_(point_to_point) {}
  void wait() override;

 private:
  GlooCommunicator* comm_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  Clock::time_point issued_;
  bool point_to_point_;
  bool done_ = false;
};

// A work that runs `then` once `inner` completed (the second half of an op built on another).
class ThenWork : public Work {
 public:
  ThenWork(std::unique_ptr<Work> inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override {
    inner_->wait();
    if (then_) std::exchange(then_, nullptr)();
  }

 private:
  std::unique_ptr<Work> inner_;
  std::function<void()> then_;
};

// A work made of several, waited for in order (an op built of several Gloo ops).
class AllWork : public Work {
 public:
  explicit AllWork(std::vector<std::unique_ptr<Work>> parts) : parts_(std::move(parts)) {}
  void wait() override { wait_all(parts_); }

 private:
  std::vector<std::unique_ptr<Work>> parts_;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const StorePtr& store, std::string prefix, GroupInfo info, std::string bind_addr)
      : Communicator(std::move(info)),
        store_(store),
        prefix_(std::move(prefix)),
        bind_addr_(std::move(bind_addr)) {
    auto opts = c10d::ProcessGroupGloo::Options::create(info_.timeout);
    opts->devices.push_back(make_device(bind_addr_));
    opts->threads = 2;
    auto pstore = c10::make_intrusive<c10d::PrefixStore>(prefix_, store_);
    // The constructor connects to every member through the store and blocks until they all came.
    std::string what = describe_op("connect", 0);
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(pstore, info_.rank, info_.size(), opts);
    } catch (const std::exception& e) {
      fail(fmt::format("connecting the group failed or timed out (a member never joined?): {}",
                       first_line(e.what())),
           what);
    }
  }

  ~GlooCommunicator() override {
    // ~ProcessGroupGloo drains its queue, each queued op waiting out its Gloo timeout on a broken
    // peer: after a failure the group is leaked and the rank exits without it.
    if (Communicator::process_failed()) (void)pg_.release();
  }

  std::string backend() const override { return "gloo"; }

  std::unique_ptr<Work> broadcast_async(at::Tensor tensor, int root) override {
    auto bytes = nbytes(tensor);
    begin_op("broadcast", bytes, root);
    std::vector<at::Tensor> ts{as_sendable(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = info_.timeout;
    return issue([&] { return pg_->broadcast(ts, o); }, describe_op("broadcast", bytes, root));
  }

  std::unique_ptr<Work> all_reduce_async(at::Tensor tensor, ReduceOp op) override {
    auto bytes = nbytes(tensor);
    begin_op("all_reduce", bytes);
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::kSum   ? c10d::ReduceOp::SUM
                 : op == ReduceOp::kMin ? c10d::ReduceOp::MIN
                                        : c10d::ReduceOp::MAX;
    o.timeout = info_.timeout;
    return issue([&] { return pg_->allreduce(ts, o); }, describe_op("all_reduce", bytes));
  }

  std::unique_ptr<Work> send_async(at::Tensor tensor, int peer) override {
    auto bytes = nbytes(tensor);
    begin_op("send", bytes, peer, "peer");
    std::vector<at::Tensor> ts{as_sendable(tensor)};
    return issue([&] { return pg_->send(ts, peer, 0); }, describe_op("send", bytes, peer, "peer"),
                 /*point_to_point=*/true);
  }

  std::unique_ptr<Work> recv_async(at::Tensor tensor, int peer) override {
    auto bytes = nbytes(tensor);
    begin_op("recv", bytes, peer, "peer");
    std::vector<at::Tensor> ts{as_sendable(tensor)};
    return issue([&] { return pg_->recv(ts, peer, 0); }, describe_op("recv", bytes, peer, "peer"),
                 /*point_to_point=*/true);
  }

  // Gloo in libtorch 1.13 has no reduce_scatter: the input is all-reduced in place (an
  // all-reduce's bytes on the wire, twice a ring reduce-scatter's) and this rank's chunk copied
  // out.
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor input, at::Tensor output) override {
    auto bytes = nbytes(input);
    begin_op("reduce_scatter", bytes);
    check_chunked("reduce_scatter", input, output);
    std::vector<at::Tensor> ts{input};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = info_.timeout;
    auto work = issue([&] { return pg_->allreduce(ts, o); }, describe_op("reduce_scatter", bytes));
    const int64_t n = output.numel();
    const int64_t begin = static_cast<int64_t>(info_.rank) * n;
    return std::make_unique<ThenWork>(std::move(work), [input, output, begin, n]() mutable {
      output.copy_(input.narrow(0, begin, n));
    });
  }

  // ProcessGroupGloo::allgather gathers into a freshly allocated flat tensor and copies it out: a
  // new bucket-sized allocation per op, whose page faults cost 25x the transfer itself (5 s vs
  // 0.19 s for 540 MB at T = 2 here). Instead each rank's chunk is broadcast from it, in place
  // into `output`: the same bytes received per rank, no allocation, T ops in issue order.
  std::unique_ptr<Work> all_gather_async(at::Tensor input, at::Tensor output) override {
    auto bytes = nbytes(output);
    begin_op("all_gather", bytes);
    check_chunked("all_gather", output, input);
    at::Tensor out = as_sendable(output).view({-1});
    const int64_t n = out.numel() / info_.size();
    at::Tensor own = out.narrow(0, info_.rank * n, n);
    if (own.data_ptr() != as_sendable(input).data_ptr()) own.copy_(as_sendable(input).view({-1}));
    std::vector<std::unique_ptr<Work>> parts;
    for (int root = 0; root < info_.size(); ++root) {
      std::vector<at::Tensor> ts{out.narrow(0, root * n, n)};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = info_.timeout;
      parts.push_back(issue([&] { return pg_->broadcast(ts, o); },
                            describe_op("all_gather", bytes / info_.size(), root)));
    }
    return std::make_unique<AllWork>(std::move(parts));
  }

  void barrier() override {
    begin_op("barrier", 0);
    c10d::BarrierOptions o;
    o.timeout = info_.timeout;
    issue([&] { return pg_->barrier(o); }, describe_op("barrier", 0))->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    int seq = split_seq_++;
    std::string base = fmt::format("{}/split{}", prefix_, seq);
    std::string what = describe_op("split -> " + name, 0);
    if (aborted_) fail("communicator was aborted", what);
    store_set(store_, fmt::format("{}/{}", base, info_.rank), fmt::format("{} {}", color, key));
    std::vector<std::string> keys;
    for (int r = 0; r < info_.size(); ++r) keys.push_back(fmt::format("{}/{}", base, r));
    auto missing = wait_keys(store_, keys, Clock::now() + info_.timeout);
    if (!missing.empty()) {
      std::vector<int> late;
      for (const auto& k : missing) late.push_back(std::atoi(k.substr(base.size() + 1).c_str()));
      fail(fmt::format("group ranks {} never reached the split (dead or stuck?)", late), what);
    }
    if (color < 0) return nullptr;
    std::vector<std::tuple<int, int, int>> members;  // (key, parent rank, world rank)
    for (int r = 0; r < info_.size(); ++r) {
      auto v = store_->get(keys[r]);
      int c = 0, k = 0;
      std::sscanf(std::string(v.begin(), v.end()).c_str(), "%d %d", &c, &k);
      if (c == color) members.emplace_back(k, r, info_.world_ranks[r]);
    }
    std::sort(members.begin(), members.end());
    GroupInfo child;
    child.name = name;
    child.timeout = info_.timeout;
    for (size_t i = 0; i < members.size(); ++i) {
      if (std::get<1>(members[i]) == info_.rank) child.rank = static_cast<int>(i);
      child.world_ranks.push_back(std::get<2>(members[i]));
    }
    return std::make_unique<GlooCommunicator>(store_, fmt::format("{}/c{}", base, color),
                                              std::move(child), bind_addr_);
  }

  void wait_work(c10d::Work& work, const std::string& what, Clock::time_point issued,
                 bool point_to_point) {
    // A small grace over Gloo's own timeout lets its (more specific) error win.
    auto deadline = deadline_for(issued) + std::chrono::milliseconds(250);
    wait_until(work, what, deadline, point_to_point);
    note_done();
  }

  void wait_until(c10d::Work& work, const std::string& what, Clock::time_point deadline,
                  bool point_to_point) {
    if (point_to_point) {
      // Gloo's send/recv works complete only inside wait(): give it the time that is left.
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      bool ok = false;
      try {
        ok = work.wait(std::max(left, std::chrono::milliseconds(1)));
      } catch (const std::exception& e) {
        fail(fmt::format("failed: {}", first_line(e.what())), what);
      }
      if (!ok) fail("aborted", what);
      return;
    }
    auto pause = std::chrono::microseconds(5);
    while (!work.isCompleted()) {
      if (aborted_) fail("communicator aborted while the op was in flight", what);
      if (Clock::now() >= deadline) {
        fail(fmt::format("deadline of {} ms passed (peer dead, stuck or never called the op?)",
                         info_.timeout.count()),
             what);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    if (auto ex = work.exception()) {
      try {
        std::rethrow_exception(ex);
      } catch (const std::exception& e) {
        fail(fmt::format("failed: {}", first_line(e.what())), what);
      }
    }
    // On CUDA tensors (a group whose members share a GPU, see sync/placement.h) c10d's Gloo copies
    // the result back to the device on a side stream: the caller's current stream waits for it. A
    // no-op on CPU tensors.
    work.synchronize();
  }

 private:
  template <typename Fn>
  std::unique_ptr<Work> issue(Fn&& fn, std::string what, bool point_to_point = false) {
    try {
      return std::make_unique<GlooWork>(this, fn(), std::move(what), Clock::now(), point_to_point);
    } catch (const std::exception& e) {
      fail(fmt::format("failed to start: {}", first_line(e.what())), what);
    }
  }

  static int64_t nbytes(const at::Tensor& t) {
    return t.numel() * static_cast<int64_t>(t.element_size());
  }

  // Gloo has no bfloat16/half reductions or transports for some dtypes: move raw bytes.
  static at::Tensor as_sendable(const at::Tensor& t) {
    if (!t.is_contiguous()) {
      throw CollectiveError("gloo: tensor must be contiguous");
    }
    if (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf ||
        t.scalar_type() == at::kBool) {
      return t.view({-1}).view(at::kByte);
    }
    return t;
  }

  static std::string first_line(const std::string& s) {
    auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  static std::shared_ptr<::gloo::transport::Device> make_device(const std::string& bind_addr) {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
    if (!bind_addr.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(bind_addr);
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  StorePtr store_;
  std::string prefix_;
  std::string bind_addr_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int split_seq_ = 0;
};

void GlooWork::wait() {
  if (done_) return;
  done_ = true;
  comm_->wait_work(*work_, what_, issued_, point_to_point_);
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const StorePtr& store,
                                                     const std::string& prefix, GroupInfo info,
                                                     const std::string& bind_addr) {
  return std::make_unique<GlooCommunicator>(store, prefix, std::move(info), bind_addr);
}

}  // namespace crl::sync

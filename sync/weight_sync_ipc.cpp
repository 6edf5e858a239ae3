// WeightSync's ipc transport (protocol in weight_sync.h): bucket memory handed over between ranks
// that share one memory space (one GPU), one device-to-device copy per bucket on each receiver.
//
// Keys (under WeightSync::key(), i.e. wsync/node<N>/):
//   v<V>/ipc/<t>/<s>        train rank t's batch s of version V: JSON [{b, h, o, n, p}] (bucket,
//                           handle hex, offset, bytes, exporting pid), set once the device finished
//                           writing those bytes
//   v<V>/ack/<t>/<s>/<i>    infer rank i copied batch s completely (its copies finished)
// The sender deletes a batch's keys once every infer rank acked it (each read it before acking).
// Push (WeightSyncOptions::ipc_push, send() only; the sender announced the version as "push"):
//   v<V>/open/<i>           infer rank i's buckets rooted at push senders: JSON [{b, h, o, n, p}],
//                           set once its device finished the work queued before receive()
//   v<V>/done/<t>/<i>       train rank t finished writing its buckets into infer rank i's
// Infer rank i deletes both once every push sender set done (each read open/<i> before).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/check.h"
#include "common/units.h"
#include "sync/bucket_ipc.h"
#include "sync/weight_sync.h"

namespace crl::sync {
namespace {

// Waiting for a peer: spin (yield) for the first few milliseconds, since a hand-over takes well
// under one and a sleep costs ~50 us of timer slack; then back off to sleeps of up to 2 ms.
class Backoff {
 public:
  void reset() {
    since_ = Clock::now();
    pause_ = std::chrono::microseconds(50);
  }
  void pause() {
    if (Clock::now() - since_ < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(2000));
  }

 private:
  Clock::time_point since_ = Clock::now();
  std::chrono::microseconds pause_{50};
};

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

nlohmann::json region_json(int64_t bucket, const IpcRegion& r) {
  return {
      {"b", bucket}, {"h", encode_handle(r.handle)}, {"o", r.offset}, {"n", r.bytes}, {"p", r.pid}};
}

// Waits until `ipc`'s device finished the work queued so far (`what`: whose), or fails `group`
// naming `where` at its deadline or on a device error.
void wait_device_or_fail(IpcMemory& ipc, Communicator& group, const std::string& what,
                         const std::string& where) {
  bool done = false;
  try {
    done = ipc.wait_writes(Clock::now() + group.timeout());
  } catch (const std::exception& e) {
    group.fail(
        fmt::format("{} ipc: device error while finishing {}: {}", ipc.name(), what, e.what()),
        where);
  }
  if (!done) {
    group.fail(fmt::format("{} ipc: the device did not finish {} within {} ms", ipc.name(), what,
                           group.timeout().count()),
               where);
  }
}

IpcRegion region_from_json(const nlohmann::json& j) {
  IpcRegion r;
  r.handle = decode_handle(j.at("h").get<std::string>());
  r.offset = j.at("o").get<int64_t>();
  r.bytes = j.at("n").get<int64_t>();
  r.pid = j.at("p").get<int64_t>();
  return r;
}

}  // namespace

std::string WeightSync::ipc_key(int64_t version, int t, int64_t seq) const {
  return key(fmt::format("v{}/ipc/{}/{}", version, t, seq));
}

WeightSync::IpcBatch WeightSync::publish_ipc_batch(
    int64_t version, int64_t seq, const std::vector<std::pair<int64_t, at::Tensor>>& items) {
  const int t = groups_.topo.role_index(groups_.world_rank);
  Communicator& group = root_group(t);
  IpcBatch batch;
  batch.seq = seq;
  for (const auto& [b, bytes] : items) {
    batch.buckets.push_back(b);
    batch.bytes += nbytes(bytes);
  }
  auto where = [&] {
    return fmt::format("{} version={} buckets={}", group.describe_op("ipc-send", batch.bytes, 0),
                       version, batch.buckets);
  };
  // Receivers read the bytes as soon as the batch is published: the device must have written them.
  wait_device_or_fail(*ipc_, group, "writing the buckets", where());
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& [b, bytes] : items) {
    IpcRegion r;
    try {
      r = ipc_->export_region(bytes);
    } catch (const std::exception& e) {
      group.fail(fmt::format("{} ipc: cannot export bucket {}: {}", ipc_->name(), b, e.what()),
                 where());
    }
    regions.push_back(region_json(b, r));
  }
  store_set(store_, ipc_key(version, t, seq), regions.dump());
  return batch;
}

void WeightSync::wait_ipc_acks(int64_t version, const IpcBatch& batch) {
  const int t = groups_.topo.role_index(groups_.world_rank);
  Communicator& group = root_group(t);
  const std::vector<int> fed = groups_.topo.receivers_of(t);
  auto ack_key = [&](int i) {
    return key(fmt::format("v{}/ack/{}/{}/{}", version, t, batch.seq, i));
  };
  std::vector<int> missing = fed;
  auto last = Clock::now();
  Backoff backoff;
  while (true) {
    std::vector<int> still;
    for (int i : missing) {
      if (!store_has(store_, ack_key(i))) still.push_back(i);
    }
    if (still.size() < missing.size()) {
      last = Clock::now();
      backoff.reset();
    }
    missing.swap(still);
    if (missing.empty()) break;
    if (Clock::now() - last > group.timeout()) {
      std::vector<std::string> who;
      const int base = groups_.node * groups_.topo.ranks_per_node();
      for (int i : missing) who.push_back(groups_.topo.describe(base + i));
      group.fail(
          fmt::format("ipc: {} never acknowledged the copy within {} ms (receiver dead, "
                      "stuck, or not receiving this version?)",
                      fmt::join(who, ", "), group.timeout().count()),
          fmt::format("{} version={} buckets={}", group.describe_op("ipc-send", batch.bytes, 0),
                      version, batch.buckets));
    }
    backoff.pause();
  }
  // Every receiver read the batch before acknowledging it: its keys can go.
  store_delete(store_, ipc_key(version, t, batch.seq));
  for (int i : fed) store_delete(store_, ack_key(i));
}

SyncStats WeightSync::send_ipc(const std::vector<at::Tensor>* tensors,
                               const std::vector<at::Tensor>* buckets, int64_t version) {
  SyncStats st;
  st.version = version;
  bool announced = false;
  auto published = [&](const IpcBatch& batch) {
    // The engines may stop generating once the first bytes are there to take.
    if (!announced) announce(version);
    announced = true;
    st.bytes += batch.bytes;
    st.collectives += static_cast<int64_t>(batch.buckets.size());  // one hand-over per bucket
    for (int64_t b : batch.buckets) {
      if (options_.on_bucket_posted) options_.on_bucket_posted(b);
    }
  };
  auto t0 = Clock::now();
  if (buckets) {
    // Flat storage already in the layout: every bucket of this sender at once, one batch.
    std::vector<std::pair<int64_t, at::Tensor>> items;
    for (const auto& b : layout_.buckets()) {
      if (!sends(b.index)) continue;
      items.emplace_back(b.index, (*buckets)[b.index].narrow(0, 0, b.nbytes));
      if (options_.verify) publish_checksum(version, b.index, items.back().second);
    }
    if (!items.empty()) {
      IpcBatch batch = publish_ipc_batch(version, 0, items);
      published(batch);
      wait_ipc_acks(version, batch);
    }
  } else if (options_.ipc_push) {
    push_ipc(*tensors, version, st);
    announced = true;
  } else {
    // Cast into `inflight` send buffers on this rank's device, one batch per bucket; a buffer is
    // packed again only once every receiver acked the batch it held.
    const int n = options_.inflight;
    if (static_cast<int>(send_buffers_.size()) < n) send_buffers_.resize(n);
    std::deque<IpcBatch> unacked;
    int64_t k = 0;
    for (const auto& b : layout_.buckets()) {
      if (!sends(b.index)) continue;
      if (static_cast<int>(unacked.size()) == n) {
        wait_ipc_acks(version, unacked.front());
        unacked.pop_front();
      }
      at::Tensor& buf = send_buffers_[k % n];
      if (!buf.defined() || buf.numel() < b.nbytes) {
        buf = at::empty({layout_.max_bucket_nbytes()},
                        at::TensorOptions().dtype(at::kByte).device(options_.device));
      }
      auto p0 = Clock::now();
      layout_.pack(*tensors, b.index, buf);
      st.pack_s += seconds_since(p0);
      at::Tensor dst = buf.narrow(0, 0, b.nbytes);
      if (options_.verify) publish_checksum(version, b.index, dst);
      IpcBatch batch = publish_ipc_batch(version, k, {{b.index, dst}});
      published(batch);
      unacked.push_back(std::move(batch));
      ++k;
    }
    while (!unacked.empty()) {
      wait_ipc_acks(version, unacked.front());
      unacked.pop_front();
    }
    for (const auto& buf : send_buffers_) {
      if (buf.defined()) st.extra_bytes += buf.numel();
    }
  }
  if (!announced) announce(version);  // a sender without buckets still takes part in the handshake
  st.transfer_s = seconds_since(t0);
  return st;
}

// One receive_ipc(): what each sender hands over and how (its announcement: the receivers copy
// its batches, or it pushes into this rank's buckets), the copies in flight, and the deadline.
class WeightSync::IpcReceive {
 public:
  IpcReceive(WeightSync& ws, std::vector<at::Tensor>& buckets, int64_t version, SyncStats& st);
  // Deletes this rank's open regions (v<V>/open/<i>): read by every push sender after a receive;
  // after a failure, withdrawn from the senders that have not read them yet (the weights are
  // undefined then either way: the engine reports the failure).
  ~IpcReceive();

  bool done() const { return open_ == 0 && pending_.empty(); }
  // One look at every sender and copy; true when anything moved.
  bool poll();
  // Fails naming the first thing that has not moved for the sync group's timeout.
  void check_deadline(Clock::time_point last);

 private:
  enum class How { kUnknown, kCopy, kPush };
  struct Sender {
    int t = 0;
    std::vector<int64_t> expected;  // its buckets, in the order it sends them
    size_t got = 0;
    int64_t seq = 0;  // its next batch
    How how = How::kUnknown;
  };
  struct Pending {
    int t = 0;
    IpcBatch batch;
    std::vector<std::unique_ptr<IpcCopy>> copies;
  };

  // Learns the senders' announcements; once all are known, opens this rank's buckets to the push
  // senders (once). True when it opened them.
  bool learn_and_open();
  // A push sender said it finished writing into this rank's buckets.
  bool take_push_done(Sender& s);
  // A copy sender's next batch: its copies start.
  bool take_batch(Sender& s);
  // Acknowledges every batch whose copies finished.
  bool ack_finished_copies();
  std::string where(int t, int64_t bytes, const std::vector<int64_t>& bs) const;

  WeightSync& ws_;
  std::vector<at::Tensor>& buckets_;
  const int64_t version_;
  SyncStats& st_;
  const int me_;
  std::vector<Sender> senders_;
  size_t open_ = 0;  // senders with buckets still to hand over
  std::deque<Pending> pending_;
  bool opened_ = false;  // this rank published its buckets to the push senders
};

WeightSync::IpcReceive::IpcReceive(WeightSync& ws, std::vector<at::Tensor>& buckets,
                                   int64_t version, SyncStats& st)
    : ws_(ws),
      buckets_(buckets),
      version_(version),
      st_(st),
      me_(ws.groups_.topo.role_index(ws.groups_.world_rank)) {
  for (int t : ws_.groups_.topo.senders_of(me_)) {
    if (ws_.transport(t) != SyncTransport::kIpc) continue;
    Sender s;
    s.t = t;
    for (const auto& b : ws_.layout_.buckets()) {
      if (ws_.sender_of(b.index) == t) s.expected.push_back(b.index);
    }
    if (!s.expected.empty()) senders_.push_back(std::move(s));
  }
  open_ = senders_.size();
}

WeightSync::IpcReceive::~IpcReceive() {
  // After a receive every push sender read this rank's regions (it said done after): they go. After
  // a failure they are withdrawn from the senders that have not read them yet.
  if (!opened_) return;
  try {
    store_delete(ws_.store_, ws_.key(fmt::format("v{}/open/{}", version_, me_)));
  } catch (...) {
  }
}

std::string WeightSync::IpcReceive::where(int t, int64_t bytes,
                                          const std::vector<int64_t>& bs) const {
  return fmt::format("{} version={} buckets={}",
                     ws_.root_group(t).describe_op("ipc-receive", bytes, 0), version_, bs);
}

bool WeightSync::IpcReceive::learn_and_open() {
  // receive() normally follows ready(), so every announcement is known at once.
  std::vector<int> pushers;
  bool unknown = false;
  for (auto& s : senders_) {
    if (s.how == How::kUnknown) {
      const std::string k = ws_.key(fmt::format("v{}/ready/{}", version_, s.t));
      if (store_has(ws_.store_, k)) {
        const std::string how =
            store_get(ws_.store_, k, Clock::now() + ws_.root_group(s.t).timeout(), "announcement");
        s.how = how == "push" ? How::kPush : How::kCopy;
      }
    }
    if (s.how == How::kUnknown) unknown = true;
    if (s.how == How::kPush) pushers.push_back(s.t);
  }
  if (opened_ || unknown || pushers.empty()) return false;
  opened_ = true;  // armed first: a failure while opening withdraws what was published
  ws_.open_ipc_buckets(buckets_, version_, pushers);
  return true;
}

bool WeightSync::IpcReceive::take_push_done(Sender& s) {
  if (!opened_) return false;
  const std::string k = ws_.key(fmt::format("v{}/done/{}/{}", version_, s.t, me_));
  if (!store_has(ws_.store_, k)) return false;
  // The sender's writes finished on the device before it said so: the weights are in place.
  for (int64_t b : s.expected) st_.bytes += ws_.layout_.buckets()[b].nbytes;
  st_.collectives += static_cast<int64_t>(s.expected.size());
  s.got = s.expected.size();
  --open_;
  store_delete(ws_.store_, k);
  return true;
}

bool WeightSync::IpcReceive::take_batch(Sender& s) {
  const std::string k = ws_.ipc_key(version_, s.t, s.seq);
  if (!store_has(ws_.store_, k)) return false;
  Communicator& group = ws_.root_group(s.t);
  auto regions =
      nlohmann::json::parse(store_get(ws_.store_, k, Clock::now() + group.timeout(), "ipc batch"));
  Pending p;
  p.t = s.t;
  p.batch.seq = s.seq;
  for (const auto& r : regions) {
    const int64_t b = r.at("b").get<int64_t>();
    const int64_t n = r.at("n").get<int64_t>();
    const bool expected = s.got < s.expected.size() && s.expected[s.got] == b;
    if (!expected || n != ws_.layout_.buckets()[b].nbytes) {
      group.fail(
          fmt::format(
              "ipc: train rank {} published bucket {} of {} bytes where bucket "
              "{} of {} bytes was due (layouts or versions out of step?)",
              s.t, b, n, s.got < s.expected.size() ? s.expected[s.got] : -1,
              s.got < s.expected.size() ? ws_.layout_.buckets()[s.expected[s.got]].nbytes : 0),
          where(s.t, n, {b}));
    }
    IpcRegion region = region_from_json(r);
    try {
      p.copies.push_back(ws_.ipc_->copy_async(region, buckets_[b].narrow(0, 0, n)));
    } catch (const std::exception& e) {
      group.fail(fmt::format("{} ipc: cannot copy bucket {} from train rank {}: {}",
                             ws_.ipc_->name(), b, s.t, e.what()),
                 where(s.t, n, {b}));
    }
    p.batch.buckets.push_back(b);
    p.batch.bytes += n;
    ++s.got;
  }
  ++s.seq;
  if (s.got == s.expected.size()) --open_;
  pending_.push_back(std::move(p));
  return true;
}

bool WeightSync::IpcReceive::ack_finished_copies() {
  bool progress = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool finished = true;
    for (auto& c : it->copies) {
      try {
        finished = c->done();
      } catch (const std::exception& e) {
        ws_.root_group(it->t).fail(
            fmt::format("{} ipc: the bucket copy failed: {}", ws_.ipc_->name(), e.what()),
            where(it->t, it->batch.bytes, it->batch.buckets));
      }
      if (!finished) break;
    }
    if (!finished) {
      ++it;
      continue;
    }
    // The bytes are in place: the sender may overwrite its buffer.
    store_set(ws_.store_,
              ws_.key(fmt::format("v{}/ack/{}/{}/{}", version_, it->t, it->batch.seq, me_)), "1");
    st_.bytes += it->batch.bytes;
    st_.collectives += static_cast<int64_t>(it->batch.buckets.size());
    it = pending_.erase(it);
    progress = true;
  }
  return progress;
}

bool WeightSync::IpcReceive::poll() {
  bool progress = learn_and_open();
  for (auto& s : senders_) {
    if (s.got == s.expected.size() || s.how == How::kUnknown) continue;
    progress |= s.how == How::kPush ? take_push_done(s) : take_batch(s);
  }
  progress |= ack_finished_copies();
  return progress;
}

void WeightSync::IpcReceive::check_deadline(Clock::time_point last) {
  if (Clock::now() - last <= ws_.groups_.sync->timeout()) return;
  if (!pending_.empty()) {
    const Pending& p = pending_.front();
    ws_.root_group(p.t).fail(fmt::format("{} ipc: the device copies did not complete within {} ms",
                                         ws_.ipc_->name(), ws_.root_group(p.t).timeout().count()),
                             where(p.t, p.batch.bytes, p.batch.buckets));
  }
  for (const auto& s : senders_) {
    if (s.got == s.expected.size()) continue;
    const int64_t b = s.expected[s.got];
    Communicator& group = ws_.root_group(s.t);
    const int world = group.info().world_ranks.at(0);
    if (s.how == How::kPush) {
      int64_t bytes = 0;
      for (int64_t e : s.expected) bytes += ws_.layout_.buckets()[e].nbytes;
      group.fail(
          fmt::format("ipc: {} did not finish writing its buckets into this engine within {} "
                      "ms (sender dead or stuck?)",
                      ws_.groups_.topo.describe(world), group.timeout().count()),
          where(s.t, bytes, s.expected));
    }
    group.fail(fmt::format("ipc: {} did not publish bucket {} within {} ms (sender dead, stuck, or "
                           "not sending this version?)",
                           ws_.groups_.topo.describe(world), b, group.timeout().count()),
               where(s.t, ws_.layout_.buckets()[b].nbytes, {b}));
  }
}

void WeightSync::receive_ipc(std::vector<at::Tensor>& buckets, int64_t version, SyncStats& st) {
  IpcReceive receive(*this, buckets, version, st);
  auto last = Clock::now();
  Backoff backoff;
  while (!receive.done()) {
    if (receive.poll()) {
      last = Clock::now();
      backoff.reset();
      continue;
    }
    receive.check_deadline(last);
    backoff.pause();
  }
}

void WeightSync::open_ipc_buckets(std::vector<at::Tensor>& buckets, int64_t version,
                                  const std::vector<int>& pushers) {
  const int me = groups_.topo.role_index(groups_.world_rank);
  Communicator& group = root_group(pushers.front());
  nlohmann::json regions = nlohmann::json::array();
  std::vector<int64_t> mine;
  int64_t bytes = 0;
  for (const auto& b : layout_.buckets()) {
    if (std::find(pushers.begin(), pushers.end(), sender_of(b.index)) == pushers.end()) {
      continue;
    }
    mine.push_back(b.index);
    bytes += b.nbytes;
  }
  auto where = [&] {
    return fmt::format("{} version={} buckets={}", group.describe_op("ipc-open", bytes, 0), version,
                       mine);
  };
  // The engine's last step may still be reading these weights on the device: the senders write
  // only once it finished.
  wait_device_or_fail(*ipc_, group, "the engine's work", where());
  for (int64_t b : mine) {
    try {
      regions.push_back(region_json(
          b, ipc_->export_region(buckets[b].narrow(0, 0, layout_.buckets()[b].nbytes))));
    } catch (const std::exception& e) {
      group.fail(fmt::format("{} ipc: cannot export bucket {}: {}", ipc_->name(), b, e.what()),
                 where());
    }
  }
  store_set(store_, key(fmt::format("v{}/open/{}", version, me)), regions.dump());
}

void WeightSync::push_ipc(const std::vector<at::Tensor>& tensors, int64_t version, SyncStats& st) {
  const int t = groups_.topo.role_index(groups_.world_rank);
  Communicator& group = root_group(t);
  const std::vector<int> fed = groups_.topo.receivers_of(t);
  const int infer = static_cast<int>(fed.size());
  std::vector<int64_t> mine;
  int64_t bytes = 0;
  for (const auto& b : layout_.buckets()) {
    if (!sends(b.index)) continue;
    mine.push_back(b.index);
    bytes += b.nbytes;
  }
  auto where = [&] {
    return fmt::format("{} version={} buckets={}", group.describe_op("ipc-push", bytes, 0), version,
                       mine);
  };
  announce(version, "push");
  if (mine.empty()) return;
  // Each engine as it opens its buckets (between two of its steps), so an engine waits only for
  // the casts into its own buckets, not for the slowest engine of the node.
  std::vector<std::string> open_keys;
  for (int i : fed) open_keys.push_back(key(fmt::format("v{}/open/{}", version, i)));
  std::vector<bool> written(infer, false);
  int left = infer;
  auto last = Clock::now();
  Backoff backoff;
  while (left > 0) {
    bool progress = false;
    for (int k = 0; k < infer; ++k) {
      if (written[k] || !store_has(store_, open_keys[k])) continue;
      const int i = fed[k];  // the infer rank
      auto regions = nlohmann::json::parse(
          store_get(store_, open_keys[k], Clock::now() + group.timeout(), "ipc open"));
      std::map<int64_t, at::Tensor> dst;  // engine i's bucket b, writable here
      for (const auto& r : regions) {
        const int64_t b = r.at("b").get<int64_t>();
        if (b < 0 || b >= static_cast<int64_t>(layout_.buckets().size()) || !sends(b)) {
          continue;
        }
        const int64_t n = r.at("n").get<int64_t>();
        if (n != layout_.buckets()[b].nbytes) {
          group.fail(fmt::format("ipc: infer rank {} opened bucket {} as {} bytes where the layout "
                                 "has {} (layouts out of step?)",
                                 i, b, n, layout_.buckets()[b].nbytes),
                     where());
        }
        try {
          dst[b] = ipc_->open_region(region_from_json(r));
        } catch (const std::exception& e) {
          group.fail(fmt::format("{} ipc: cannot open infer rank {}'s bucket {}: {}", ipc_->name(),
                                 i, b, e.what()),
                     where());
        }
      }
      const bool first = left == infer;
      // One cast per bucket, written where the engine reads its weights.
      for (int64_t b : mine) {
        if (!dst.count(b)) {
          group.fail(fmt::format("ipc: infer rank {} did not open bucket {}", i, b), where());
        }
        auto p0 = Clock::now();
        layout_.pack(tensors, b, dst[b]);
        st.pack_s += seconds_since(p0);
        if (!first) continue;
        if (options_.verify) publish_checksum(version, b, dst[b]);
        st.bytes += layout_.buckets()[b].nbytes;
        st.collectives += 1;
        if (options_.on_bucket_posted) options_.on_bucket_posted(b);
      }
      wait_device_or_fail(*ipc_, group, "writing the engine's buckets", where());
      store_set(store_, key(fmt::format("v{}/done/{}/{}", version, t, i)), "1");
      written[k] = true;
      --left;
      progress = true;
    }
    if (progress) {
      last = Clock::now();
      backoff.reset();
      continue;
    }
    if (Clock::now() - last > group.timeout()) {
      std::vector<std::string> who;
      const int base = groups_.node * groups_.topo.ranks_per_node();
      for (int k = 0; k < infer; ++k) {
        if (!written[k]) who.push_back(groups_.topo.describe(base + fed[k]));
      }
      group.fail(fmt::format("ipc: {} never opened its weight buckets within {} ms (receiver "
                             "dead, stuck, or not receiving this version?)",
                             fmt::join(who, ", "), group.timeout().count()),
                 where());
    }
    backoff.pause();
  }
}

}  // namespace crl::sync

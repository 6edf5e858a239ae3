// WeightSync's ipc transport (protocol in weight_sync.h): bucket memory handed over between ranks
// that share one memory space (one GPU), one device-to-device copy per bucket on each receiver.
//
// Keys (under WeightSync::key(), i.e. wsync/node<N>/):
//   v<V>/ipc/<t>/<s>        train rank t's batch s of version V: JSON [{b, h, o, n, p}] (bucket,
//                           handle hex, offset, bytes, exporting pid), set once the device finished
//                           writing those bytes
//   v<V>/ack/<t>/<s>/<i>    infer rank i copied batch s completely (its copies finished)
// The sender deletes a batch's keys once every infer rank acked it (each read it before acking).
#include "sync/weight_sync.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <deque>
#include <thread>

#include "common/check.h"
#include "common/units.h"
#include "sync/bucket_ipc.h"

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
  bool written = false;
  try {
    written = ipc_->wait_writes(Clock::now() + group.timeout());
  } catch (const std::exception& e) {
    group.fail(fmt::format("{} ipc: device error while finishing the bucket writes: {}",
                           ipc_->name(), e.what()),
               where());
  }
  if (!written) {
    group.fail(fmt::format("{} ipc: the device did not finish writing the buckets within {} ms",
                           ipc_->name(), group.timeout().count()),
               where());
  }
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& [b, bytes] : items) {
    IpcRegion r;
    try {
      r = ipc_->export_region(bytes);
    } catch (const std::exception& e) {
      group.fail(fmt::format("{} ipc: cannot export bucket {}: {}", ipc_->name(), b, e.what()),
                 where());
    }
    regions.push_back({{"b", b},
                       {"h", encode_handle(r.handle)},
                       {"o", r.offset},
                       {"n", r.bytes},
                       {"p", r.pid}});
  }
  store_set(store_, ipc_key(version, t, seq), regions.dump());
  return batch;
}

void WeightSync::wait_ipc_acks(int64_t version, const IpcBatch& batch) {
  const int t = groups_.topo.role_index(groups_.world_rank);
  Communicator& group = root_group(t);
  const int infer = groups_.topo.infer_per_node;
  auto ack_key = [&](int i) {
    return key(fmt::format("v{}/ack/{}/{}/{}", version, t, batch.seq, i));
  };
  std::vector<int> missing;
  for (int i = 0; i < infer; ++i) missing.push_back(i);
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
      group.fail(fmt::format("ipc: {} never acknowledged the copy within {} ms (receiver dead, "
                             "stuck, or not receiving this version?)",
                             fmt::join(who, ", "), group.timeout().count()),
                 fmt::format("{} version={} buckets={}",
                             group.describe_op("ipc-send", batch.bytes, 0), version,
                             batch.buckets));
    }
    backoff.pause();
  }
  // Every receiver read the batch before acknowledging it: its keys can go.
  store_delete(store_, ipc_key(version, t, batch.seq));
  for (int i = 0; i < infer; ++i) store_delete(store_, ack_key(i));
}

SyncStats WeightSync::send_ipc(const std::vector<at::Tensor>* tensors,
                               const std::vector<at::Tensor>* buckets, int64_t version) {
  const int t = groups_.topo.role_index(groups_.world_rank);
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
      if (root_of_bucket(b.index) != t) continue;
      items.emplace_back(b.index, (*buckets)[b.index].narrow(0, 0, b.nbytes));
      if (options_.verify) publish_checksum(version, b.index, items.back().second);
    }
    if (!items.empty()) {
      IpcBatch batch = publish_ipc_batch(version, 0, items);
      published(batch);
      wait_ipc_acks(version, batch);
    }
  } else {
    // Cast into `inflight` send buffers on this rank's device, one batch per bucket; a buffer is
    // packed again only once every receiver acked the batch it held.
    const int n = options_.inflight;
    if (static_cast<int>(send_buffers_.size()) < n) send_buffers_.resize(n);
    std::deque<IpcBatch> unacked;
    int64_t k = 0;
    for (const auto& b : layout_.buckets()) {
      if (root_of_bucket(b.index) != t) continue;
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

void WeightSync::receive_ipc(std::vector<at::Tensor>& buckets, int64_t version, SyncStats& st) {
  const int me = groups_.topo.role_index(groups_.world_rank);
  struct Sender {
    int t = 0;
    std::vector<int64_t> expected;  // its buckets, in the order it sends them
    size_t got = 0;
    int64_t seq = 0;                // its next batch
  };
  struct Pending {
    int t = 0;
    IpcBatch batch;
    std::vector<std::unique_ptr<IpcCopy>> copies;
  };
  std::vector<Sender> senders;
  for (int t = 0; t < groups_.topo.train_per_node; ++t) {
    if (transport(t) != SyncTransport::kIpc) continue;
    Sender s;
    s.t = t;
    for (const auto& b : layout_.buckets()) {
      if (root_of_bucket(b.index) == t) s.expected.push_back(b.index);
    }
    if (!s.expected.empty()) senders.push_back(std::move(s));
  }
  size_t open = senders.size();
  std::deque<Pending> pending;
  auto where = [&](int t, int64_t bytes, const std::vector<int64_t>& bs) {
    return fmt::format("{} version={} buckets={}",
                       root_group(t).describe_op("ipc-receive", bytes, 0), version, bs);
  };
  auto last = Clock::now();
  Backoff backoff;
  while (open > 0 || !pending.empty()) {
    bool progress = false;
    for (auto& s : senders) {
      if (s.got == s.expected.size()) continue;
      const std::string k = ipc_key(version, s.t, s.seq);
      if (!store_has(store_, k)) continue;
      Communicator& group = root_group(s.t);
      auto regions = nlohmann::json::parse(
          store_get(store_, k, Clock::now() + group.timeout(), "ipc batch"));
      Pending p;
      p.t = s.t;
      p.batch.seq = s.seq;
      for (const auto& r : regions) {
        const int64_t b = r.at("b").get<int64_t>();
        const int64_t n = r.at("n").get<int64_t>();
        const bool expected = s.got < s.expected.size() && s.expected[s.got] == b;
        if (!expected || n != layout_.buckets()[b].nbytes) {
          group.fail(fmt::format("ipc: train rank {} published bucket {} of {} bytes where bucket "
                                 "{} of {} bytes was due (layouts or versions out of step?)",
                                 s.t, b, n, s.got < s.expected.size() ? s.expected[s.got] : -1,
                                 s.got < s.expected.size()
                                     ? layout_.buckets()[s.expected[s.got]].nbytes
                                     : 0),
                     where(s.t, n, {b}));
        }
        IpcRegion region;
        region.handle = decode_handle(r.at("h").get<std::string>());
        region.offset = r.at("o").get<int64_t>();
        region.bytes = n;
        region.pid = r.at("p").get<int64_t>();
        try {
          p.copies.push_back(ipc_->copy_async(region, buckets[b].narrow(0, 0, n)));
        } catch (const std::exception& e) {
          group.fail(fmt::format("{} ipc: cannot copy bucket {} from train rank {}: {}",
                                 ipc_->name(), b, s.t, e.what()),
                     where(s.t, n, {b}));
        }
        p.batch.buckets.push_back(b);
        p.batch.bytes += n;
        ++s.got;
      }
      ++s.seq;
      if (s.got == s.expected.size()) --open;
      pending.push_back(std::move(p));
      progress = true;
    }
    for (auto it = pending.begin(); it != pending.end();) {
      bool done = true;
      for (auto& c : it->copies) {
        try {
          done = c->done();
        } catch (const std::exception& e) {
          root_group(it->t).fail(fmt::format("{} ipc: the bucket copy failed: {}", ipc_->name(),
                                             e.what()),
                                 where(it->t, it->batch.bytes, it->batch.buckets));
        }
        if (!done) break;
      }
      if (!done) {
        ++it;
        continue;
      }
      // The bytes are in place: the sender may overwrite its buffer.
      store_set(store_, key(fmt::format("v{}/ack/{}/{}/{}", version, it->t, it->batch.seq, me)),
                "1");
      st.bytes += it->batch.bytes;
      st.collectives += static_cast<int64_t>(it->batch.buckets.size());
      it = pending.erase(it);
      progress = true;
    }
    if (progress) {
      last = Clock::now();
      backoff.reset();
      continue;
    }
    if (Clock::now() - last > groups_.sync->timeout()) {
      if (!pending.empty()) {
        const Pending& p = pending.front();
        root_group(p.t).fail(
            fmt::format("{} ipc: the device copies did not complete within {} ms", ipc_->name(),
                        root_group(p.t).timeout().count()),
            where(p.t, p.batch.bytes, p.batch.buckets));
      }
      for (const auto& s : senders) {
        if (s.got == s.expected.size()) continue;
        const int64_t b = s.expected[s.got];
        const int world = root_group(s.t).info().world_ranks.at(0);
        root_group(s.t).fail(
            fmt::format("ipc: {} did not publish bucket {} within {} ms (sender dead, stuck, or "
                        "not sending this version?)",
                        groups_.topo.describe(world), b, root_group(s.t).timeout().count()),
            where(s.t, layout_.buckets()[b].nbytes, {b}));
      }
    }
    backoff.pause();
  }
}

}  // namespace crl::sync

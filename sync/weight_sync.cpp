#include "sync/weight_sync.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <stdexcept>

#include "common/check.h"
#include "common/units.h"
#include "sync/bucket_ipc.h"
#include "sync/cuda_ipc.h"

namespace crl::sync {
namespace {

int64_t total_ops(const Groups& g) {
  int64_t n = 0;
  for (const auto& c : g.sync_roots) {
    if (c) n += c->op_count();
  }
  for (const auto& lane : g.lane_roots) {
    for (const auto& c : lane) {
      if (c) n += c->op_count();
    }
  }
  return n;
}

}  // namespace

WeightSync::WeightSync(Groups& groups, const StorePtr& store, const WeightLayout& layout,
                       WeightSyncOptions options)
    : groups_(groups), store_(store), layout_(layout), options_(options) {
  if (options_.inflight < 1) CRL_INVALID("sync in-flight buffers must be >= 1");
  if (options_.lanes < 1 || options_.lanes > groups_.topo.lanes) {
    CRL_INVALID("weight sync: ", options_.lanes, " tensor-parallel lane(s), but the groups have ",
                groups_.topo.lanes);
  }
  if (options_.lanes > 1 && options_.mode != SyncMode::kBucket) {
    CRL_INVALID("weight sync over tensor-parallel lanes is bucket mode, not ",
                sync_mode_name(options_.mode));
  }
  std::vector<int64_t> bytes;
  for (const auto& b : layout_.buckets()) bytes.push_back(b.nbytes);
  senders_ = fan_out_senders(bytes, groups_.topo.train_per_node);
  Communicator& sync = *groups_.sync;
  // Agree on the layout once: every member publishes it (after its lane count) and compares every
  // other's hash and lanes.
  store_set(store_, key(fmt::format("layout/{}", sync.rank())),
            fmt::format("{} {}", options_.lanes, layout_to_json(layout_)));
  auto deadline = Clock::now() + sync.timeout();
  for (int r = 0; r < sync.size(); ++r) {
    if (r == sync.rank()) continue;
    int world = sync.info().world_ranks[r];
    std::string other_json = store_get(
        store_, key(fmt::format("layout/{}", r)), deadline,
        fmt::format("weight sync setup: op=layout-exchange group={} rank={} waited for {}",
                    sync.name(), sync.rank(), groups_.topo.describe(world)));
    const size_t space = other_json.find(' ');
    const int other_lanes = std::stoi(other_json.substr(0, space));
    WeightLayout other = layout_from_json(other_json.substr(space + 1));
    if (other_lanes != options_.lanes) {
      throw std::runtime_error(fmt::format(
          "weight layout mismatch at setup: {} (this) sends or receives over {} tensor-parallel "
          "lane(s), {} (other) over {}",
          groups_.topo.describe(groups_.world_rank), options_.lanes, groups_.topo.describe(world),
          other_lanes));
    }
    if (other.hash() != layout_.hash()) {
      auto diff = layout_.first_difference(other);
      throw std::runtime_error(
          fmt::format("weight layout mismatch at setup between {} (this) and {} (other): {}",
                      groups_.topo.describe(groups_.world_rank), groups_.topo.describe(world),
                      diff.value_or(fmt::format("hashes differ ({:016x} vs {:016x})",
                                                layout_.hash(), other.hash()))));
    }
  }
  choose_transports(deadline);
}

WeightSync::~WeightSync() = default;

void WeightSync::choose_transports(Clock::time_point deadline) {
  Communicator& sync = *groups_.sync;
  const int T = groups_.topo.train_per_node;
  // Every member publishes where its buckets live; every member reads them all.
  const DeviceIdentity mine = identify_device(options_.device);
  store_set(store_, key(fmt::format("device/{}", sync.rank())), mine.to_json());
  std::vector<SyncMember> members(sync.size());
  for (int r = 0; r < sync.size(); ++r) {
    int world = sync.info().world_ranks[r];
    members[r].who = groups_.topo.describe(world);
    if (r == sync.rank()) {
      members[r].device = mine;
      continue;
    }
    members[r].device = DeviceIdentity::from_json(store_get(
        store_, key(fmt::format("device/{}", r)), deadline,
        fmt::format("weight sync setup: op=device-exchange group={} rank={} waited for {}",
                    sync.name(), sync.rank(), members[r].who)));
  }
  SyncTransport requested = options_.transport;
  if (options_.mode != SyncMode::kBucket) {
    if (requested == SyncTransport::kIpc) {
      CRL_INVALID("sync transport ipc moves whole buckets; the ", sync_mode_name(options_.mode),
                  " baseline always uses the communicator");
    }
    requested = SyncTransport::kCommunicator;
  }
  // Sync rank t is train rank t; infer rank i is sync rank T + i (groups.h).
  bool need_ipc = false;
  const Topology& topo = groups_.topo;
  const int self = topo.role_index(groups_.world_rank);
  for (int t = 0; t < T; ++t) {
    std::vector<SyncMember> group = {members.at(t)};
    const std::vector<int> fed = topo.receivers_of(t);
    for (int i : fed) group.push_back(members.at(T + i));
    transports_.push_back(
        select_transport(requested, fmt::format("sync.node{}.root{}", groups_.node, t), group));
    const bool member = groups_.role == Role::kInfer
                            ? std::find(fed.begin(), fed.end(), self) != fed.end()
                            : self == t;
    need_ipc |= member && transports_.back() == SyncTransport::kIpc;
  }
  if (options_.lanes > 1) {
    for (int t = 0; t < T; ++t) {
      if (transports_[t] != SyncTransport::kCommunicator) {
        CRL_INVALID(
            "weight sync over tensor-parallel lanes goes over the communicator; the "
            "sync_root group of train rank ",
            t, " would use ", sync_transport_name(transports_[t]));
      }
    }
  }
  if (need_ipc) ipc_ = mine.is_cuda() ? make_cuda_ipc_memory(mine.index) : make_host_ipc_memory();
}

std::string WeightSync::key(const std::string& what) const {
  if (options_.scope.empty()) return fmt::format("wsync/node{}/{}", groups_.node, what);
  return fmt::format("wsync/node{}/{}/{}", groups_.node, options_.scope, what);
}

int WeightSync::sender_of(int64_t bucket) const {
  return groups_.topo.sender_of(bucket, groups_.topo.role_index(groups_.world_rank), senders_);
}

bool WeightSync::sends(int64_t bucket) const {
  return groups_.topo.sends(groups_.topo.role_index(groups_.world_rank), bucket, senders_);
}

int WeightSync::baseline_sender() const {
  return groups_.topo.paired ? groups_.topo.role_index(groups_.world_rank) : 0;
}

Communicator& WeightSync::root_group(int t, int lane) const {
  Communicator* c = groups_.sync_root(t, lane);
  CRL_CHECK(c, "this rank is not in sync root group ", t, " (lane ", lane, ")");
  return *c;
}

void WeightSync::announce(int64_t version, const char* how) {
  // Nothing older is withdrawn here: a collective can end on the sender before a receiver entered
  // it (a tree broadcast's inner rank, or buckets that fit the transport's buffers), so a slow
  // engine may still be looking for version - 1. wait_requested() withdraws what every receiver
  // is known to be past.
  store_set(store_,
            key(fmt::format("v{}/ready/{}", version, groups_.topo.role_index(groups_.world_rank))),
            how);
}

void WeightSync::request(int64_t version) {
  const int i = groups_.topo.role_index(groups_.world_rank);
  store_set(store_, key(fmt::format("v{}/want/{}", version, i)), "1");
  // The senders read version - 1's requests before sending it, and it arrived: they can go.
  store_delete(store_, key(fmt::format("v{}/want/{}", version - 1, i)));
}

void WeightSync::wait_requested(int64_t version, Clock::time_point deadline) const {
  std::vector<std::string> want;
  for (int i : groups_.topo.receivers_of(groups_.topo.role_index(groups_.world_rank))) {
    want.push_back(key(fmt::format("v{}/want/{}", version, i)));
  }
  auto missing = wait_keys(store_, want, deadline);
  if (!missing.empty()) {
    throw std::runtime_error(
        fmt::format("the engines of node {} never asked for weights version "
                    "{} (missing: {})",
                    groups_.node, version, fmt::join(missing, ", ")));
  }
  // Every receiver asks for `version` once it applied version - 1 (announced, received and
  // verified): this sender's announcement of version - 1 and its checksums of version - 2 can go
  // (not version - 1's, which a receiver that asked early may still be reading).
  const int t = groups_.topo.role_index(groups_.world_rank);
  store_->deleteKey(key(fmt::format("v{}/ready/{}", version - 1, t)));
  for (const auto& b : layout_.buckets()) {
    if (!sends(b.index)) continue;
    for (int lane = 0; lane < options_.lanes; ++lane)
      store_->deleteKey(sum_key(version - 2, t, b.index, lane));
  }
}

bool WeightSync::ready(int64_t version) const {
  const std::vector<int> senders =
      options_.mode == SyncMode::kBucket
          ? groups_.topo.senders_of(groups_.topo.role_index(groups_.world_rank))
          : std::vector<int>{baseline_sender()};
  for (int t : senders) {
    if (!store_has(store_, key(fmt::format("v{}/ready/{}", version, t)))) return false;
  }
  return true;
}

std::string WeightSync::sum_key(int64_t version, int t, int64_t bucket, int lane) const {
  if (lane == 0) return key(fmt::format("v{}/sum/{}/{}", version, t, bucket));
  return key(fmt::format("v{}/sum/{}/{}/lane{}", version, t, bucket, lane));
}

void WeightSync::publish_checksum(int64_t version, int64_t bucket, const at::Tensor& bytes,
                                  int lane) {
  store_set(store_, sum_key(version, groups_.topo.role_index(groups_.world_rank), bucket, lane),
            std::to_string(checksum_bytes(bytes)));
}

void WeightSync::verify_bucket(int64_t version, int64_t bucket, const at::Tensor& bytes,
                               Clock::time_point deadline, int lane) {
  const auto& b = layout_.buckets()[bucket];
  std::string want = store_get(store_, sum_key(version, sender_of(b.index), b.index, lane),
                               deadline, fmt::format("--sync-verify of version {}", version));
  auto got = checksum_bytes(bytes.narrow(0, 0, b.nbytes));
  if (std::to_string(got) != want) {
    const auto& first = layout_.specs()[b.entries.front().tensor];
    const auto& last = layout_.specs()[b.entries.back().tensor];
    throw std::runtime_error(fmt::format(
        "--sync-verify: version {} bucket {}{} ({} bytes, tensors {} .. {}) received on {} "
        "differs from what train rank {} of node {} sent (checksum {:x} vs {})",
        version, b.index, options_.lanes > 1 ? fmt::format(" of lane {}", lane) : "", b.nbytes,
        first.name, last.name, groups_.topo.describe(groups_.world_rank), sender_of(b.index),
        groups_.node, got, want));
  }
}

void WeightSync::verify_buckets(int64_t version, const std::vector<at::Tensor>& buckets,
                                SyncStats& stats, int lane) {
  auto deadline = Clock::now() + groups_.sync->timeout();
  for (const auto& b : layout_.buckets())
    verify_bucket(version, b.index, buckets[b.index], deadline, lane);
  stats.verified = true;
}

SyncStats WeightSync::receive_staged(int64_t version, const at::Tensor& staging,
                                     const LandFn& land) {
  CRL_CHECK(groups_.role == Role::kInfer, "receive_staged() on a train rank");
  if (options_.lanes > 1) {
    CRL_INVALID("weight sync over ", options_.lanes,
                " tensor-parallel lanes: receive_lanes() takes every rank's buckets");
  }
  if (options_.mode != SyncMode::kBucket) {
    CRL_INVALID("weight sync: a staged receive (a tensor-parallel engine) takes bucket mode, not ",
                sync_mode_name(options_.mode));
  }
  if (!staging.is_contiguous() || staging.scalar_type() != at::kByte ||
      staging.numel() < layout_.max_bucket_nbytes()) {
    CRL_INVALID("weight sync: the staging buffer must be contiguous uint8 of at least ",
                layout_.max_bucket_nbytes(), " bytes");
  }
  SyncStats st;
  st.version = version;
  st.extra_bytes = layout_.max_bucket_nbytes();
  const int64_t ops0 = total_ops(groups_);
  const auto t0 = Clock::now();
  const auto deadline = t0 + groups_.sync->timeout();
  for (const auto& b : layout_.buckets()) {
    if (transport(sender_of(b.index)) == SyncTransport::kIpc) {
      CRL_INVALID(
          "weight sync: a staged receive (a tensor-parallel engine) goes over a "
          "communicator, not CUDA IPC (bucket ",
          b.index, " from train rank ", sender_of(b.index), ")");
    }
    at::Tensor bytes = staging.narrow(0, 0, b.nbytes);
    root_group(sender_of(b.index)).broadcast(bytes, 0);
    st.bytes += b.nbytes;
    if (options_.verify) verify_bucket(version, b.index, bytes, deadline);
    const auto l0 = Clock::now();
    land(b.index, bytes);
    st.load_s += seconds_since(l0);
  }
  st.transfer_s = seconds_since(t0) - st.load_s;
  st.collectives = total_ops(groups_) - ops0;
  st.verified = options_.verify;
  return st;
}

namespace {

// The runs a send goes through: the stream's (every train rank the same), else one.
std::vector<std::pair<int64_t, int64_t>> send_runs(const WeightLayout& layout,
                                                   const SendStream* stream, int64_t chunk_bytes) {
  return layout.chunks(stream ? chunk_bytes : 0);
}

// Gathers a stream whole before the first send (over CUDA IPC, in the baselines, and on a node
// where any sender uses CUDA IPC).
void gather_whole(const WeightLayout& layout, const SendStream* stream) {
  const auto n = static_cast<int64_t>(layout.buckets().size());
  if (stream && n > 0) stream->gather(0, n);
}

// Where a stream goes run by run: only where every sender of the node broadcasts. A sender over
// CUDA IPC announces the version after its whole gather, and an engine waits for every
// announcement before it receives, so a broadcasting sender that waited for its run's receivers
// would wait in the next run's gather for the IPC sender forever. Returns the stream to follow
// (nullptr: gathered whole here).
const SendStream* run_by_run(const WeightLayout& layout, const SendStream* stream,
                             const std::vector<SyncTransport>& transports) {
  for (SyncTransport t : transports) {
    if (t != SyncTransport::kCommunicator) {
      gather_whole(layout, stream);
      return nullptr;
    }
  }
  return stream;
}

}  // namespace

SyncStats WeightSync::send(const std::vector<at::Tensor>& tensors, int64_t version,
                           const SendStream* stream) {
  CRL_CHECK(groups_.role == Role::kTrain, "send() on an infer rank");
  if (tensors.size() != layout_.specs().size()) {
    CRL_INVALID("weight sync: ", tensors.size(), " tensors for a layout of ",
                layout_.specs().size());
  }
  SyncStats st;
  st.version = version;
  int t = groups_.topo.role_index(groups_.world_rank);
  int64_t ops0 = total_ops(groups_);

  if (options_.mode == SyncMode::kPerTensor) {
    gather_whole(layout_, stream);  // every train rank, before the baseline's other ranks return
    // The baseline sends everything from the node's first train rank (paired: each from its own).
    if (t != baseline_sender()) return st;
    announce(version);
    auto t0 = Clock::now();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& spec = layout_.specs()[i];
      auto p0 = Clock::now();
      at::Tensor buf = tensors[i].to(spec.dtype).contiguous();
      st.pack_s += seconds_since(p0);
      root_group(t).broadcast(buf, 0);
      st.bytes += spec.nbytes();
      st.extra_bytes = std::max<int64_t>(st.extra_bytes, spec.nbytes());
    }
    st.transfer_s = seconds_since(t0);
    st.collectives = total_ops(groups_) - ops0;
    return st;
  }
  CRL_CHECK(options_.mode == SyncMode::kBucket, "use raw_broadcast() for the raw baseline");
  if (options_.lanes > 1) {
    CRL_INVALID("weight sync over ", options_.lanes,
                " tensor-parallel lanes: send_lanes() slices each tensor for its lane");
  }
  return send_packed(tensors, nullptr, version, stream);
}

SyncStats WeightSync::send_lanes(const std::vector<at::Tensor>& tensors, const LaneSlicer& slice,
                                 int64_t version, const SendStream* stream) {
  CRL_CHECK(groups_.role == Role::kTrain, "send_lanes() on an infer rank");
  CRL_CHECK(options_.mode == SyncMode::kBucket, "send_lanes() is bucket mode only");
  CRL_CHECK(static_cast<bool>(slice), "send_lanes() without a slicer");
  if (tensors.size() != layout_.specs().size()) {
    CRL_INVALID("weight sync: ", tensors.size(), " tensors for a layout of ",
                layout_.specs().size());
  }
  return send_packed(tensors, &slice, version, stream);
}

SyncStats WeightSync::send_packed(const std::vector<at::Tensor>& tensors, const LaneSlicer* slice,
                                  int64_t version, const SendStream* stream) {
  SyncStats st;
  st.version = version;
  const int t = groups_.topo.role_index(groups_.world_rank);
  const int64_t ops0 = total_ops(groups_);
  stream = run_by_run(layout_, stream, transports_);
  if (transport(t) == SyncTransport::kIpc) return send_ipc(&tensors, nullptr, version);

  announce(version);
  int n = options_.inflight;
  if (static_cast<int>(send_buffers_.size()) < n) send_buffers_.resize(n);
  std::deque<std::unique_ptr<Work>> inflight;
  std::vector<at::Tensor> parts;  // with lanes: the lane's parts of one bucket's tensors
  if (slice != nullptr) st.lane_bytes.assign(options_.lanes, 0);
  int k = 0;
  auto t0 = Clock::now();
  // With lanes a bucket holds 1/lanes of its tensors: runs of chunk / lanes bytes gather about
  // the chunk's bytes of parameters, as without lanes.
  const int64_t chunk = options_.stream_chunk_bytes <= 0
                            ? 0
                            : std::max<int64_t>(1, options_.stream_chunk_bytes / options_.lanes);
  for (const auto& [first, end] : send_runs(layout_, stream, chunk)) {
    if (stream) {
      // pack() has copied the runs before into the send buffers (on a GPU, ordered before the
      // gather's writes on the device), so gather() may reuse their memory. Their broadcasts
      // finish first all the same: the train group's all-gather never runs beside this rank's
      // sync broadcasts (concurrent NCCL communicators on one GPU can deadlock).
      while (!inflight.empty()) {
        inflight.front()->wait();
        inflight.pop_front();
      }
      stream->gather(first, end);
    }
    for (int64_t bi = first; bi < end; ++bi) {
      const Bucket& b = layout_.buckets()[bi];
      if (!sends(b.index)) continue;
      for (int lane = 0; lane < options_.lanes; ++lane) {
        if (static_cast<int>(inflight.size()) == n) {
          inflight.front()->wait();
          inflight.pop_front();
        }
        at::Tensor& buf = send_buffers_[k % n];
        if (!buf.defined() || buf.numel() < b.nbytes) {
          // On the trainer's device: casting happens there, and NCCL sends from it.
          buf = at::empty({layout_.max_bucket_nbytes()},
                          at::TensorOptions().dtype(at::kByte).device(tensors.front().device()));
        }
        auto p0 = Clock::now();
        if (slice != nullptr) {
          // The lane's parts of this bucket's tensors, sliced now (inside the stream's run).
          parts.assign(tensors.size(), at::Tensor());
          for (const BucketEntry& e : b.entries) {
            parts[e.tensor] = (*slice)(lane, e.tensor, tensors[e.tensor]);
          }
          layout_.pack(parts, b.index, buf);
        } else {
          layout_.pack(tensors, b.index, buf);
        }
        st.pack_s += seconds_since(p0);
        at::Tensor dst = buf.narrow(0, 0, b.nbytes);
        if (options_.verify) publish_checksum(version, b.index, dst, lane);
        inflight.push_back(root_group(t, lane).broadcast_async(dst, 0));
        if (options_.on_bucket_posted) options_.on_bucket_posted(b.index);
        st.bytes += b.nbytes;
        if (slice != nullptr) st.lane_bytes.at(lane) += b.nbytes;
        ++k;
      }
    }
  }
  while (!inflight.empty()) {
    inflight.front()->wait();
    inflight.pop_front();
  }
  st.transfer_s = seconds_since(t0);
  for (const auto& buf : send_buffers_) {
    if (buf.defined()) st.extra_bytes += buf.numel();
  }
  st.collectives = total_ops(groups_) - ops0;
  return st;
}

SyncStats WeightSync::send_buckets(const std::vector<at::Tensor>& buckets, int64_t version,
                                   const SendStream* stream) {
  CRL_CHECK(groups_.role == Role::kTrain, "send_buckets() on an infer rank");
  CRL_CHECK(options_.mode == SyncMode::kBucket, "send_buckets() is bucket mode only");
  if (options_.lanes > 1) {
    CRL_INVALID(
        "weight sync over tensor-parallel lanes: send_lanes() slices the tensors; whole "
        "buckets are one engine's");
  }
  if (buckets.size() != layout_.buckets().size()) {
    CRL_INVALID("weight sync: ", buckets.size(), " buckets for a layout of ",
                layout_.buckets().size());
  }
  int t = groups_.topo.role_index(groups_.world_rank);
  stream = run_by_run(layout_, stream, transports_);
  if (transport(t) == SyncTransport::kIpc) return send_ipc(nullptr, &buckets, version);
  SyncStats st;
  st.version = version;
  int64_t ops0 = total_ops(groups_);
  announce(version);
  std::vector<std::unique_ptr<Work>> works;
  auto t0 = Clock::now();
  for (const auto& [first, end] : send_runs(layout_, stream, options_.stream_chunk_bytes)) {
    if (stream) {
      // The broadcasts read the buckets themselves: the run before is sent before gather() may
      // reuse its memory (and the train group's all-gather never runs beside this rank's sync
      // broadcasts). The senders of one run still send at once.
      wait_all(works);
      works.clear();
      stream->gather(first, end);
    }
    for (int64_t bi = first; bi < end; ++bi) {
      const Bucket& b = layout_.buckets()[bi];
      if (!sends(b.index)) continue;
      at::Tensor src = buckets[b.index].narrow(0, 0, b.nbytes);
      if (options_.verify) publish_checksum(version, b.index, src);
      works.push_back(root_group(t).broadcast_async(src, 0));
      if (options_.on_bucket_posted) options_.on_bucket_posted(b.index);
      st.bytes += b.nbytes;
    }
  }
  wait_all(works);
  st.transfer_s = seconds_since(t0);
  st.collectives = total_ops(groups_) - ops0;
  return st;
}

SyncStats WeightSync::receive(std::vector<at::Tensor>& buckets, int64_t version,
                              const LoadFn& load) {
  CRL_CHECK(groups_.role == Role::kInfer, "receive() on a train rank");
  if (options_.lanes > 1) {
    CRL_INVALID("weight sync over ", options_.lanes,
                " tensor-parallel lanes: receive_lanes() takes every rank's buckets");
  }
  if (buckets.size() != layout_.buckets().size()) {
    CRL_INVALID("weight sync: ", buckets.size(), " receive buckets for a layout of ",
                layout_.buckets().size());
  }
  SyncStats st;
  st.version = version;
  int64_t ops0 = total_ops(groups_);
  auto t0 = Clock::now();
  if (options_.mode == SyncMode::kPerTensor) {
    std::vector<at::Tensor> views;
    if (!load) views = layout_.views(buckets);
    for (size_t i = 0; i < layout_.specs().size(); ++i) {
      const auto& spec = layout_.specs()[i];
      at::Tensor tmp =
          at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype).device(buckets[0].device()));
      root_group(baseline_sender()).broadcast(tmp, 0);
      auto l0 = Clock::now();
      if (load) {
        load(static_cast<int64_t>(i), tmp);
      } else {
        views[i].copy_(tmp);
      }
      st.load_s += seconds_since(l0);
      st.bytes += spec.nbytes();
      st.extra_bytes = std::max<int64_t>(st.extra_bytes, spec.nbytes());
    }
  } else {
    CRL_CHECK(options_.mode == SyncMode::kBucket, "use raw_broadcast() for the raw baseline");
    std::vector<std::unique_ptr<Work>> works;
    bool ipc = false;
    for (const auto& b : layout_.buckets()) {
      at::Tensor& dst = buckets[b.index];
      if (!dst.is_contiguous() || dst.scalar_type() != at::kByte || dst.numel() < b.nbytes) {
        CRL_INVALID("weight sync: receive bucket ", b.index, " must be contiguous uint8 of ",
                    b.nbytes, " bytes");
      }
      if (transport(sender_of(b.index)) == SyncTransport::kIpc) {
        ipc = true;  // received below
        continue;
      }
      works.push_back(
          root_group(sender_of(b.index)).broadcast_async(dst.narrow(0, 0, b.nbytes), 0));
      st.bytes += b.nbytes;
    }
    if (ipc) {
      try {
        receive_ipc(buckets, version, st);
      } catch (...) {
        works.clear();  // abandoned: the rank fails anyway
        throw;
      }
    }
    wait_all(works);
  }
  st.transfer_s = seconds_since(t0);
  st.collectives += total_ops(groups_) - ops0;  // receive_ipc() counted its bucket copies
  if (options_.verify && options_.mode == SyncMode::kBucket) verify_buckets(version, buckets, st);
  return st;
}

SyncStats WeightSync::receive_lanes(const std::vector<std::vector<at::Tensor>*>& lanes,
                                    int64_t version) {
  CRL_CHECK(groups_.role == Role::kInfer, "receive_lanes() on a train rank");
  if (static_cast<int>(lanes.size()) != options_.lanes) {
    CRL_INVALID("weight sync: buckets of ", lanes.size(), " tensor-parallel rank(s) for ",
                options_.lanes, " lane(s)");
  }
  SyncStats st;
  st.version = version;
  st.lane_bytes.assign(options_.lanes, 0);
  const int64_t ops0 = total_ops(groups_);
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Work>> works;
  for (int lane = 0; lane < options_.lanes; ++lane) {
    std::vector<at::Tensor>& buckets = *lanes[lane];
    if (buckets.size() != layout_.buckets().size()) {
      CRL_INVALID("weight sync: lane ", lane, " has ", buckets.size(),
                  " receive buckets for a layout of ", layout_.buckets().size());
    }
    for (const auto& b : layout_.buckets()) {
      at::Tensor& dst = buckets[b.index];
      if (!dst.is_contiguous() || dst.scalar_type() != at::kByte || dst.numel() < b.nbytes) {
        CRL_INVALID("weight sync: lane ", lane, " receive bucket ", b.index,
                    " must be contiguous uint8 of ", b.nbytes, " bytes");
      }
      works.push_back(
          root_group(sender_of(b.index), lane).broadcast_async(dst.narrow(0, 0, b.nbytes), 0));
      st.bytes += b.nbytes;
      st.lane_bytes[lane] += b.nbytes;
    }
  }
  wait_all(works);
  st.transfer_s = seconds_since(t0);
  st.collectives = total_ops(groups_) - ops0;
  if (options_.verify) {
    for (int lane = 0; lane < options_.lanes; ++lane)
      verify_buckets(version, *lanes[lane], st, lane);
  }
  return st;
}

SyncStats WeightSync::raw_broadcast(at::Tensor flat, int64_t version) {
  const int root = baseline_sender();
  if (transport(root) == SyncTransport::kIpc) {
    CRL_INVALID("the raw baseline is a communicator broadcast; this WeightSync uses CUDA IPC");
  }
  SyncStats st;
  st.version = version;
  bool sender = groups_.role == Role::kTrain;
  if (sender && groups_.topo.role_index(groups_.world_rank) != root) return st;
  int64_t ops0 = total_ops(groups_);
  if (sender) announce(version);
  auto t0 = Clock::now();
  root_group(root).broadcast(flat, 0);
  st.transfer_s = seconds_since(t0);
  st.bytes = flat.numel() * static_cast<int64_t>(flat.element_size());
  st.collectives = total_ops(groups_) - ops0;
  return st;
}

}  // namespace crl::sync

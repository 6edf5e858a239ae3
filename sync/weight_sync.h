// WeightSync: whole-model weight updates from the train ranks into the engines (docs/design.md §3).
//
// Setup (constructor, collective over the node's sync group through the store): every member
// publishes its WeightLayout; a hash mismatch fails on every member with an error naming the first
// differing tensor. After that one sync of version v is, per bucket b, one broadcast rooted at the
// node's train rank that sends b (fan_out_senders: about 1/T of the bytes each; its group
// sync_roots[t]) straight into the engine's bucket buffers;
// in the paired layout (sync/groups.h) train rank t sends every bucket to infer rank t alone.
//
//   sender (train rank t)  fills a send buffer per bucket (casting from the trainer's tensors)
//                          with `inflight` buffers so packing bucket k+1 overlaps sending bucket k;
//                          or sends straight from flat storage already in the layout.
//   receiver (infer rank)  posts every bucket's broadcast into its live weight buckets at once:
//                          no staging copy, no per-tensor load call, no extra memory.
//
// It is the engine's WeightSource: the engine loop polls ready(v), which tells it without blocking
// that the senders have started version v, so it keeps generating until then and its pause is the
// transfer itself; it then calls receive() between two steps and sets its version.
//
// Modes other than kBucket exist only as benchmark baselines: kPerTensor is one broadcast plus one
// load call per tensor from the node's first train rank (as OpenRLHF did), kRaw is one broadcast of
// one flat buffer of the layout's byte count.
//
// Transports (sync/sync_transport.h), chosen per sync_root group at setup, where every member
// publishes the device its buckets live on: members on distinct devices (or all on the CPU) use
// the group's communicator as above; members all on one GPU (an engine and a trainer colocated on
// it, which NCCL cannot serve) hand buckets over through CUDA IPC (sync/weight_sync_ipc.cpp):
//
//   sender    writes the bucket (pack/cast into a send buffer, or its flat storage as is), waits
//             until the device finished writing it, publishes (handle, offset, bytes) of the bucket
//             memory under v<V>/ipc/<t>/<batch> (a batch: one bucket of send(), every bucket of
//             send_buckets()), announces the version after its first batch, and before it reuses
//             a buffer (the `inflight` send buffers) or returns waits for every infer rank's
//             v<V>/ack/<t>/<batch>/<i>, then deletes those keys;
//   receiver  opens each handle once (cached until destruction), makes ONE device-to-device copy
//             per bucket into its live weight bucket, ordered after libtorch's stream, and acks a
//             batch once its copies completed, so receive() returns with the weights in place.
//
// With a cast (send()) and options.ipc_push, the direction turns around, so the bytes are written
// once (no send buffer, no second copy):
//
//   sender    announces the version as "push"; for each infer rank as its v<V>/open/<i> (its
//             weight buckets' regions) appears, casts each of its buckets straight into that
//             engine's bucket, waits until the device finished writing, and sets v<V>/done/<t>/<i>;
//   receiver  (inside receive(), between two engine steps) waits until its queued device work
//             finished (the last step read the weights about to change), publishes its buckets'
//             regions under v<V>/open/<i>, and returns once every push sender set done; it then
//             deletes its open and done keys (open also when it fails: senders that have not read
//             it yet write nothing). Its weights change only while it waits there.
//
// Every wait (device, batch, ack) has the group's timeout, counted from the last progress; expiry
// throws CollectiveError naming op, group, ranks, version, bucket(s) and bytes.
//
// --sync-verify: after a sync every sender publishes a checksum per bucket it sent and every
// receiver compares its received bytes with it; a mismatch names the bucket and its tensors.
//
// Tensor-parallel lanes (options.lanes N > 1; the groups' lanes, sync/groups.h): the engines are
// groups of N ranks, each keeping its slices of every tensor (engine/model/tensor_parallel.h) in
// weight buckets of its own, all laid out as one shard's `layout` (the layout exchanged and
// hashed, with N). A sender slices its whole tensors per lane (send_lanes) and sends bucket b of
// lane r over lane r's copy of its sync_root group; an infer rank receives lane r into rank r's
// buckets (receive_lanes). Still one collective per bucket and lane, the same senders, the same
// handshake; each engine rank receives its 1/N of the model, no rank the whole. Bucket mode over
// the communicator only.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/groups.h"
#include "sync/store.h"
#include "sync/sync_transport.h"
#include "sync/weight_layout.h"
#include "sync/weight_source.h"

namespace crl::sync {

enum class SyncMode { kBucket, kPerTensor, kRaw };
SyncMode parse_sync_mode(const std::string& s);  // "bucket", "per-tensor", "raw"
const char* sync_mode_name(SyncMode m);

struct WeightSyncOptions {
  SyncMode mode = SyncMode::kBucket;
  int inflight = 2;     // sender buffers in flight (>= 1)
  bool verify = false;  // per-bucket checksums compared after each sync
  // How bucket mode moves buckets: auto (CUDA IPC where a sync_root group's members are all on
  // one GPU, the communicator otherwise), or forced (benchmarks, tests). The per-tensor and raw
  // baselines always use the communicator.
  SyncTransport transport = SyncTransport::kAuto;
  // CUDA IPC with a cast (send(), e.g. fp32 masters into bf16 engines): push casts straight into
  // the engines' exported weight buckets, one pass over the bytes and no send buffer; pull casts
  // into `inflight` send buffers that the engines copy from. send_buckets() (dtypes equal) always
  // hands its flat storage over for the engines to copy (one pass either way).
  bool ipc_push = true;
  // Where this rank's buckets live (the engine's weight buckets, the trainer's tensors): published
  // at setup to choose the transport. cuda without an index: the current device.
  at::Device device = at::kCPU;
  // Store keys of this sync live under wsync/node<n>/<scope>: two WeightSyncs with different
  // layouts on the same groups (bench sync's model and LoRA rows) need different scopes.
  std::string scope;
  // A streamed send (SendStream): the layout's buckets a run of at most this many bytes at a time
  // (WeightLayout::chunks; <= 0: every bucket in one run).
  int64_t stream_chunk_bytes = int64_t{1} << 30;
  // Tensor-parallel lanes (above): 1, or the engines' group size (<= the groups' topo.lanes).
  int lanes = 1;
  // Fault-injection hook for tests: called by a sender after it posted each bucket.
  std::function<void(int64_t bucket)> on_bucket_posted;
};

// A sender whose weights exist a run of buckets at a time (a ZeRO-3 trainer gathers its
// parameters for the update): send() and send_buckets() call gather(first, end) before they read
// any of buckets [first, end), for every run of layout().chunks(options().stream_chunk_bytes) in
// order, whether this rank sends a bucket of it or not (so a collective inside gather() runs on
// every train rank in the same order), and only once this rank's sends of the runs before have
// completed: gather() may free what they held, and its collective never runs beside them. In the
// baseline modes, and on a node where any sender uses CUDA IPC, the stream is gathered whole (one
// gather() of every bucket) before the first send.
struct SendStream {
  std::function<void(int64_t first, int64_t end)> gather;
};

// Called by a per-tensor receiver with each received tensor (the "load_weights" call).
using LoadFn = std::function<void(int64_t tensor_index, const at::Tensor& received)>;

// A lane's part of a whole tensor (send_lanes): `full` is tensor `tensor` of the layout's specs in
// the sender's whole shape; the result has the spec's shape (a view is fine).
using LaneSlicer = std::function<at::Tensor(int lane, int64_t tensor, const at::Tensor& full)>;

class IpcMemory;

class WeightSync : public WeightSource {
 public:
  // REQUIRES: groups, store and layout outlive this object. Throws std::runtime_error naming the
  // first differing tensor when the node's members disagree on the layout, or naming the members
  // and their devices when a sync_root group can use neither transport (select_transport()).
  WeightSync(Groups& groups, const StorePtr& store, const WeightLayout& layout,
             WeightSyncOptions options);
  ~WeightSync() override;
  WeightSync(const WeightSync&) = delete;
  WeightSync& operator=(const WeightSync&) = delete;

  const WeightLayout& layout() const { return layout_; }
  const WeightSyncOptions& options() const { return options_; }
  // Routing (Topology: fan-out or paired). On an infer rank: the train rank it gets `bucket`
  // from; on a train rank: whether it sends `bucket`.
  int sender_of(int64_t bucket) const;
  bool sends(int64_t bucket) const;
  // The transport of the node's sync_root group t (the same on every member).
  SyncTransport transport(int t = 0) const { return transports_.at(t); }

  // Train ranks. `tensors`: one per spec in spec order, spec shapes, any floating dtype (cast to
  // the layout's dtype while packing).
  // With `stream`, the tensors hold their values only inside its gather() runs.
  SyncStats send(const std::vector<at::Tensor>& tensors, int64_t version,
                 const SendStream* stream = nullptr);
  // Train ranks, with lanes: `tensors` are the whole tensors (one per spec, in spec order, any
  // shape `slice` takes), lane r's bucket b packed from slice(r, i, tensors[i]) just before it is
  // sent (so inside the stream's runs). A streamed send gathers each run once for every lane, in
  // runs of stream_chunk_bytes / lanes of the (sliced) layout: about stream_chunk_bytes of whole
  // tensors a run.
  SyncStats send_lanes(const std::vector<at::Tensor>& tensors, const LaneSlicer& slice,
                       int64_t version, const SendStream* stream = nullptr);
  // Train ranks, dtypes already equal: `buckets` are the layout's flat buffers (as from
  // allocate_buckets, e.g. the trainer's parameters live in them); sent without a copy.
  // REQUIRES with CUDA IPC: the same buffers every version, kept allocated while this object
  // lives (receivers keep each exported allocation open; freeing it under them is undefined).
  SyncStats send_buckets(const std::vector<at::Tensor>& buckets, int64_t version,
                         const SendStream* stream = nullptr);

  // The version handshake, so a broadcast's deadline never covers an engine still busy: an infer
  // rank request()s `version` once it can take it between two engine steps; the train ranks
  // wait_requested() before they send it (throws std::runtime_error naming the node and version
  // when some engine did not ask by `deadline`).
  void request(int64_t version);
  void wait_requested(int64_t version, Clock::time_point deadline) const;
  // Infer ranks. True once every sender of the node has started `version` (non-blocking).
  bool ready(int64_t version) const override;
  // Receives `version` into `buckets` (the engine's live weight buckets) in place. In per-tensor
  // mode each tensor is received into a temporary and handed to `load` (without one: copied into
  // its view of `buckets`).
  SyncStats receive(std::vector<at::Tensor>& buckets, int64_t version) override {
    return receive(buckets, version, LoadFn());
  }
  SyncStats receive(std::vector<at::Tensor>& buckets, int64_t version, const LoadFn& load);
  // Bucket mode over a communicator (not CUDA IPC): each bucket's broadcast into `staging`, its
  // --sync-verify checksum, then land(bucket, its bytes).
  SyncStats receive_staged(int64_t version, const at::Tensor& staging, const LandFn& land) override;
  // Infer ranks with lanes: lane r into *lanes[r] (options.lanes entries, each as receive()'s
  // buckets); every lane's broadcasts posted before any is waited for.
  SyncStats receive_lanes(const std::vector<std::vector<at::Tensor>*>& lanes,
                          int64_t version) override;

  // Benchmark baseline kRaw, both sides: one broadcast of `flat` (layout total bytes) from the
  // node's first train rank.
  SyncStats raw_broadcast(at::Tensor flat, int64_t version);

 private:
  Communicator& root_group(int t, int lane = 0) const;
  // The bucket-mode send over the communicator: lane r of bucket b packed from `slice`'s parts
  // (no slice: the tensors themselves, one lane).
  SyncStats send_packed(const std::vector<at::Tensor>& tensors, const LaneSlicer* slice,
                        int64_t version, const SendStream* stream);
  // The one train rank the per-tensor and raw baselines send from: the node's first (fan-out), or
  // this rank's pair (paired).
  int baseline_sender() const;
  // how: "1" (the receivers copy), or "push" (the sender writes into the receivers' buckets).
  void announce(int64_t version, const char* how = "1");
  void publish_checksum(int64_t version, int64_t bucket, const at::Tensor& bytes, int lane = 0);
  void verify_buckets(int64_t version, const std::vector<at::Tensor>& buckets, SyncStats& stats,
                      int lane = 0);
  void verify_bucket(int64_t version, int64_t bucket, const at::Tensor& bytes,
                     Clock::time_point deadline, int lane = 0);
  std::string sum_key(int64_t version, int t, int64_t bucket, int lane) const;
  std::string key(const std::string& what) const;
  void choose_transports(Clock::time_point deadline);

  // CUDA IPC (weight_sync_ipc.cpp). One batch: buckets handed over together, acked together.
  struct IpcBatch {
    int64_t seq = 0;
    std::vector<int64_t> buckets;
    int64_t bytes = 0;
  };
  SyncStats send_ipc(const std::vector<at::Tensor>* tensors, const std::vector<at::Tensor>* buckets,
                     int64_t version);
  IpcBatch publish_ipc_batch(int64_t version, int64_t seq,
                             const std::vector<std::pair<int64_t, at::Tensor>>& items);
  void wait_ipc_acks(int64_t version, const IpcBatch& batch);
  void push_ipc(const std::vector<at::Tensor>& tensors, int64_t version, SyncStats& st);
  void open_ipc_buckets(std::vector<at::Tensor>& buckets, int64_t version,
                        const std::vector<int>& pushers);
  class IpcReceive;  // one receive_ipc()'s state (weight_sync_ipc.cpp)
  void receive_ipc(std::vector<at::Tensor>& buckets, int64_t version, SyncStats& st);
  std::string ipc_key(int64_t version, int t, int64_t seq) const;

  Groups& groups_;
  StorePtr store_;
  const WeightLayout& layout_;
  std::vector<int> senders_;  // fan-out: each bucket's train rank (fan_out_senders)
  WeightSyncOptions options_;
  std::vector<at::Tensor> send_buffers_;
  std::vector<SyncTransport> transports_;  // per sync_root group t
  std::unique_ptr<IpcMemory> ipc_;         // set when some group of this rank uses ipc
};

// 64-bit checksum of a contiguous tensor's bytes (order-sensitive; equal bytes, equal sums). A
// device tensor is read through the host `chunk_bytes` at a time (a multiple of 32), so a receiver
// verifying a bucket needs no bucket-sized host copy; the sum does not depend on the chunk size.
uint64_t checksum_bytes(const at::Tensor& t, int64_t chunk_bytes = int64_t{256} << 10);

// The layout as one line of JSON (specs, bucket_bytes, alignment), and back.
std::string layout_to_json(const WeightLayout& layout);
WeightLayout layout_from_json(const std::string& json);

}  // namespace crl::sync

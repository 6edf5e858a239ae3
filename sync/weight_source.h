// WeightSource: where an engine's weight updates come from (docs/design.md §3). The narrow
// interface between the engine and sync/: the engine loop polls it between two steps and receives a
// version into its own weight buckets; WeightSync (the train ranks' broadcasts) implements it. LoRA
// adapter versions are meant to be a second kind of source.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

namespace crl::sync {

// What one received (or sent) weight update cost.
struct SyncStats {
  int64_t version = 0;
  int64_t bytes = 0;        // payload bytes this rank sent or received
  int64_t collectives = 0;  // collective calls this rank issued (ipc: buckets handed over)
  double transfer_s = 0;    // first op posted -> last op completed (this rank)
  double pack_s = 0;        // sender: filling/casting send buffers
  double load_s = 0;        // per-tensor receiver: the load calls
  int64_t extra_bytes = 0;  // buffers this sync allocated (send buffers, staging)
  bool verified = false;    // checksums compared and equal
  // Tensor-parallel lanes (receive_lanes, WeightSync::send_lanes): the bytes of each lane, by
  // lane; empty otherwise.
  std::vector<int64_t> lane_bytes;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Non-blocking: true once `version` can be received now (its senders have started it).
  virtual bool ready(int64_t version) const = 0;
  // Receives `version` into `buckets` (the engine's live weight buckets, one contiguous uint8
  // tensor per bucket of the layout both sides agreed on) in place. Throws on any failure, with an
  // error naming the op; the buckets' contents are then undefined.
  virtual SyncStats receive(std::vector<at::Tensor>& buckets, int64_t version) = 0;
  // For an engine whose weights are not the buckets (a tensor-parallel engine keeps a slice of
  // each tensor): receives `version` one bucket at a time into `staging` (contiguous uint8 of at
  // least the largest bucket's bytes, reused for every bucket) and calls `land(bucket, bytes)`
  // once each has arrived, in bucket order. The same collectives as receive(). Throws as
  // receive(); a source that cannot stage throws std::logic_error.
  using LandFn = std::function<void(int64_t bucket, const at::Tensor& bytes)>;
  virtual SyncStats receive_staged(int64_t version, const at::Tensor& staging, const LandFn& land);
  // For a tensor-parallel engine whose ranks keep their slices in weight buckets of their own, all
  // laid out alike (one shard's layout): receives `version` into every rank's buckets at once,
  // lanes[r] being rank r's, each rank's slices over a lane of its own (sync/groups.h), so no rank
  // receives another's bytes. Throws as receive(); a source without lanes throws std::logic_error.
  virtual SyncStats receive_lanes(const std::vector<std::vector<at::Tensor>*>& lanes,
                                  int64_t version);
};

inline SyncStats WeightSource::receive_staged(int64_t, const at::Tensor&, const LandFn&) {
  throw std::logic_error("this weight source receives into whole buckets only");
}

inline SyncStats WeightSource::receive_lanes(const std::vector<std::vector<at::Tensor>*>&,
                                             int64_t) {
  throw std::logic_error("this weight source has no tensor-parallel lanes");
}

}  // namespace crl::sync

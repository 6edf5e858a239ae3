// TrainState: one train rank's weights, gradients and AdamW state in flat buckets (docs/design.md
// §5b).
//
// Layout: the parameters are planned into buckets by sync::WeightLayout in the compute dtype, so
// with the engine's dtype and bucket size the first nbytes of each parameter buffer *is* that
// weight-sync bucket (buckets()). Each bucket's element range is padded to T equal slices of a
// 64-element multiple; with ZeRO (stage >= 1) train rank r owns slice r of every bucket.
//
//   stage 0  every rank: full fp32 gradients, full fp32 master and Adam m, v; gradients are
//            all-reduced (the replicated baseline)
//   stage 1  full fp32 gradients; each bucket is reduce-scattered; master, m, v of the own slice
//   stage 2  gradients of the own slice only: every micro-batch reduce-scatters each bucket as
//            backward completes it (from a small pool of full-bucket buffers) and adds the result
//            to the slice; a micro-batch is then a collective round (see Trainer)
//   stage 3  as stage 2, and the compute-dtype parameters too: each rank keeps its own slice of
//            every bucket; a bucket's full buffer exists only while some holder needs it
//            (acquire(): all-gathered from the slices; release(): its storage freed). The full
//            parameter tensors (parameters(), buckets()) stay valid views whose storage comes and
//            goes, so autograd's saved weights see the gathered values again in backward.
//
// After AdamW steps the slices, the compute-dtype parameters are all-gathered per bucket (stage 3:
// the own slice is updated and nothing is gathered). With fp32 compute and no offload the master
// slice is the parameter buffer's own slice (no copy).
//
// Stage 3's holders are parameter groups (set_parameter_groups(): the trainer's root group and one
// per decoder layer). A group's buckets are gathered by acquire(g) unless resident; after the last
// release a bucket stays gathered (idle) until an acquire of a group that does not need it, so
// neighbouring layers sharing a bucket gather it once, and the step frees them all;
// acquire_for_backward(g) takes a hold that add_grad() drops once every parameter of the group has
// its gradient. Every rank calls them in the same order (their gathers are collectives over the
// group). With offload the master and moments live on the host (pinned when the parameters are on
// CUDA).
//
// Gradients enter through add_grad(), called by the trainer's autograd sink as backward produces
// each parameter's gradient. Buckets are launched in descending index order (backward's order),
// only when every higher bucket was launched, so every rank issues the same collectives in the
// same order.
//
// Thread safety: one thread (plus the autograd engine calling add_grad, and at stage 3
// acquire_for_backward and prefetch, during backward(), while that thread waits in it).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/weight_loader.h"
#include "sync/communicator.h"
#include "sync/weight_layout.h"

namespace crl::trainer {

struct TrainStateOptions {
  int zero_stage = 0;
  at::ScalarType compute_dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool offload_optimizer = false;
  int64_t bucket_bytes = int64_t{64} << 20;
};

struct AdamWSettings {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};

// Bytes this rank holds, by kind (persistent plus the stage-2 pool's high-water mark).
struct StateBytes {
  int64_t parameters = 0;  // compute-dtype parameters (stage 3: slices + gathered high-water mark)
  int64_t gradients = 0;   // fp32 gradient buffers (stage 2: slices + in-flight bucket buffers)
  int64_t optimizer = 0;   // fp32 master (when not aliased) + Adam m, v
  int64_t total() const { return parameters + gradients + optimizer; }
};

class TrainState {
 public:
  // `weights`: full fp32 (model_param_specs order). `group`: the train group (nullptr = one rank).
  TrainState(const engine::NamedTensors& weights, TrainStateOptions options,
             sync::Communicator* group);
  // The same from `read(i, from, count)`: elements [from, from + count) of spec i, row-major, as a
  // 1-D floating tensor (fp32 for exact masters; any device). Stage 3 over several ranks reads only
  // this rank's slices (e.g. engine::CheckpointReader::load_range: no rank holds the whole model).
  using ReadFn = std::function<at::Tensor(size_t i, int64_t from, int64_t count)>;
  TrainState(const std::vector<engine::ParamSpec>& specs, const ReadFn& read,
             TrainStateOptions options, sync::Communicator* group);
  ~TrainState();

  // Compute-dtype parameters, views into the flat buffers (model_param_specs order).
  const engine::NamedTensors& parameters() const { return params_; }
  // The layout's buckets as uint8 views of the parameter buffers (what a weight sync sends).
  const std::vector<at::Tensor>& buckets() const { return bucket_bytes_views_; }
  const sync::WeightLayout& layout() const { return layout_; }
  int shards() const { return shards_; }
  int shard_rank() const { return shard_rank_; }
  StateBytes bytes() const;
  // Stage 3: the parameters are sharded (their full buffers exist only while held).
  // Stage 3 over more than one rank (on one there is nothing to shard: its buffers stay whole).
  bool sharded_parameters() const { return sharded_; }

  // Stage 3 (no-ops otherwise): group_of_param[i] is parameter i's group, in [0, groups).
  void set_parameter_groups(const std::vector<int>& group_of_param);
  void acquire(int group);
  void release(int group);
  // A hold released by add_grad() when the group's last gradient of the micro-batch arrives.
  void acquire_for_backward(int group);
  // Drops the backward holds still taken (end_micro_batch() does; a backward that threw).
  void release_backward_holds();
  // Starts gathering `group`'s buckets that are not resident, without waiting (FSDP2's prefetch:
  // the next layer's gather runs while this one computes); its acquire() then waits for them. Every
  // rank calls it at the same points. No-op unless sharded or when set_prefetch(false).
  void prefetch(int group);
  void set_prefetch(bool on) { prefetch_on_ = on; }
  int64_t prefetched_buckets() const { return prefetched_; }  // over the state's life
  int64_t prefetches_used() const { return prefetch_used_; }  // of those, found in flight by hold
  // A hold on the buckets keep(b) says, gathering every bucket not resident in order (a
  // collective per bucket: every rank calls it, whatever its `keep`); release_kept() drops it.
  void acquire_buckets(const std::function<bool(int64_t)>& keep);
  // The same a run at a time (a streamed weight update, sync::SendStream): drops the kept buckets
  // with no parameter at or after `first`, then holds every bucket with a parameter in
  // [first, end) that this stream has not gathered yet, in order (a collective per bucket, the
  // same on every rank whatever its `keep`), keeping those keep(b) says. Runs go forward:
  // `first` never below an earlier call's. release_kept() ends the stream.
  void acquire_parameters(int64_t first, int64_t end, const std::function<bool(int64_t)>& keep);
  void release_kept();
  // The most gathered bytes (buckets and spare buffers) between the last acquire_buckets() or
  // first acquire_parameters() and release_kept(): what a weight update held.
  int64_t update_gathered_peak() const { return update_peak_; }

  void zero_grad();
  // A micro-batch's backward begins; with `launch` (stage 2 always, else the step's last one)
  // buckets are reduced as they complete.
  void begin_micro_batch(bool launch);
  void add_grad(int64_t param, const at::Tensor& grad);
  // Launches the buckets backward did not complete (unused parameters, an empty round).
  void end_micro_batch();
  // Stages 0 and 1: launches the step's reductions if no micro-batch did (none said `last`, or
  // this rank had none), so every rank has issued them before any later collective.
  void launch_remaining();

  // Waits for the reductions, multiplies the gradients by `scale`, returns the global norm before
  // clipping (one all-reduce of the slice norms), clips to `max_norm` (0 = off), steps AdamW on the
  // owned slices (weight decay on matrices only) and all-gathers the parameters.
  double step(double scale, double max_norm, const AdamWSettings& adam);
  int64_t adam_step() const { return adam_step_; }

  // Full fp32 tensors per parameter, gathered over the group (a collective when shards() > 1:
  // every rank calls it; on the host at stage 3, else on the parameters' device). `keep` false:
  // takes part without keeping the result (returns empty). what: 0 = master, 1 = exp_avg, 2 =
  // exp_avg_sq.
  engine::NamedTensors gather(int what, bool keep);
  // Loads per-parameter full tensors into the own slices (what: as gather()).
  void scatter(int what, const engine::NamedTensors& full);
  // The same from a reader of flat element ranges: read(param, from, count) returns elements
  // [from, from + count) of parameter `param` (model_param_specs order), so a rank reads only the
  // parts its slices hold (a checkpoint's memory-mapped file, not a full copy per rank).
  using RangeReader = std::function<at::Tensor(int64_t param, int64_t from, int64_t count)>;
  void scatter(int what, const RangeReader& read);
  void set_adam_step(int64_t s) { adam_step_ = s; }

 private:
  struct Pending;
  at::Tensor grad_target(int64_t bucket);
  void launch_ready();
  void launch(int64_t bucket);
  void finish(Pending& p);  // waits for one reduction (stage 2: adds it to the slice)
  void wait_pending();
  at::Tensor slice_of(const at::Tensor& full, int64_t bucket) const;
  // The own slice of a bucket's parameters: stage 3's shard, else a view of the full buffer.
  at::Tensor own_params(int64_t bucket) const;
  void hold(int64_t bucket);    // stage 3: gathers the bucket into its full buffer if not resident
  void unhold(int64_t bucket);  // leaves it idle (gathered) when no holder is left
  void evict(int64_t bucket);   // frees an idle bucket's buffer (into the spares)
  void evict_idle(const std::vector<int64_t>& except);
  // Stage 3: gives bucket b gathering memory (a spare that fits, else new) and returns its full
  // buffer's alias for the all-gather.
  at::Tensor gather_target(int64_t bucket);
  // Waits for a prefetched bucket's gather (it is then idle); false when none was in flight.
  bool settle(int64_t bucket);

  TrainStateOptions o_;
  sync::Communicator* group_;
  int shards_ = 1, shard_rank_ = 0;
  bool sharded_ = false;  // stage 3 over more than one rank
  sync::WeightLayout layout_;
  at::Device state_device_ = at::kCPU;
  std::vector<int64_t> slice_;                      // elements per slice, per bucket
  std::vector<std::pair<int64_t, int64_t>> where_;  // per parameter: (bucket, element offset)
  std::vector<int64_t> expected_;                   // parameters per bucket
  std::vector<std::vector<std::pair<int64_t, int64_t>>> decay_;  // per bucket: slice ranges
  std::vector<at::Tensor> param_full_;                           // compute dtype, [shards * slice]
  // Stage 3: the own slices, holders per bucket, the groups' buckets and parameter counts, the
  // micro-batch's gradient arrivals per group and its backward holds, the gathered bytes now and
  // at most, and the buckets acquire_buckets() kept.
  std::vector<at::Tensor> param_shard_;
  std::vector<int> holds_;
  // Idle: gathered with no holder, until an acquire that does not need it (parameters change only
  // at the step); a buffer's allocated bytes; freed buffers kept for the next gathers.
  std::vector<bool> idle_;
  // Prefetched: a gather in flight (its Work; the full buffer's alias it writes); idle once waited.
  std::vector<std::unique_ptr<sync::Work>> gathering_;
  std::vector<at::Tensor> gathering_into_;
  bool prefetch_on_ = true;
  int64_t prefetched_ = 0, prefetch_used_ = 0;
  std::vector<int64_t> cap_;
  std::vector<std::pair<at::DataPtr, int64_t>> spare_;
  int64_t spare_bytes_ = 0;
  std::vector<int> group_of_param_;
  std::vector<std::vector<int64_t>> group_buckets_;
  std::vector<int64_t> group_params_, group_arrived_;
  std::vector<bool> backward_hold_;
  int64_t gathered_bytes_ = 0, gathered_peak_ = 0;
  std::vector<int64_t> kept_;
  bool updating_ = false;    // between acquire_buckets()/acquire_parameters() and release_kept()
  int64_t update_next_ = 0;  // the next bucket acquire_parameters() gathers
  int64_t update_peak_ = 0;
  std::vector<at::Tensor> bucket_bytes_views_;
  engine::NamedTensors params_;
  std::vector<at::Tensor> master_, exp_avg_, exp_avg_sq_;  // fp32 [slice]
  bool master_aliased_ = false;
  at::Tensor scratch_;  // fp32 [max slice]: AdamW's denominator
  // stage 0/1: full fp32 gradients; stage 2: fp32 slices + a pool of full-bucket buffers.
  std::vector<at::Tensor> grad_full_, grad_slice_, pool_;
  std::vector<int> pool_free_;
  std::vector<int> slot_of_;  // stage 2: pool slot of a bucket this round, or -1
  std::vector<int64_t> arrived_;
  int64_t next_launch_ = -1;
  bool launching_ = false;
  bool reduced_ = false;  // stage 0/1: this step's buckets were launched
  std::vector<std::unique_ptr<Pending>> pending_;
  int64_t adam_step_ = 0;
};

}  // namespace crl::trainer

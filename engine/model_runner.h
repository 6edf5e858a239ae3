// ModelRunner: owns the paged KV cache tensor and runs the Transformer on a scheduled batch.
//
// Owns: kv_cache_ [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim] in the model's
// compute dtype and device. Builds the packed inputs of a SchedulerOutput (tokens, positions, slot
// mapping, block tables, query offsets, the copy-on-write block pairs and the rows that sample) in
// one host buffer, pinned on a GPU, and uploads it with one asynchronous copy a step; performs the
// scheduler's copy-on-write block copies and runs the forward with paged attention. Nothing in a
// step reads device memory back: the forward's host-side numbers (largest position, query and
// context lengths) come from the schedule.
//
// Thread safety: only the engine thread calls it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/scheduler.h"
#include "engine/weight_buffers.h"
#include "sync/tp_group.h"

namespace crl::engine {

struct StepLayout;
struct Filled;

struct ForwardOutput {
  at::Tensor hidden;  // [T, hidden]: final-normed hidden state of every scheduled token
  std::vector<int64_t> row_start;  // first row of each ScheduledSeq in `hidden`
  at::Tensor sample_hidden;        // [S, hidden]: the last row of each ScheduledSeq that samples
                                   // (ScheduledSeq::sample), in batch order
  int64_t h2d_bytes = 0;           // bytes uploaded to the device for this step (0 on the CPU)
};

class ModelRunner {
 public:
  // REQUIRES: `model` outlives the runner.
  ModelRunner(const Transformer& model, int32_t block_size, int32_t num_blocks);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Bytes of one KV block over all layers (K and V).
  static int64_t block_bytes(const ModelConfig& config, at::ScalarType dtype, int32_t block_size);

  ForwardOutput execute(const SchedulerOutput& batch);

  // The logits [R, vocab] float32 of `fwd` (the last execute()'s output): of its sample rows
  // (sample_logits), or of rows [first, first + count) of its hidden states (row_logits). A
  // tensor-parallel group whose shards split the vocabulary computes them together: the leader
  // tells the others which rows, each rank takes its part of the vocabulary from its own copy of
  // the step's hidden states (the group's sums give every rank the same), and the parts are
  // gathered to the leader (only it samples). Else the model's compute_logits.
  // REQUIRES: `fwd` is the last execute()'s (the followers answer with their last step's rows).
  at::Tensor sample_logits(const ForwardOutput& fwd);
  at::Tensor row_logits(const ForwardOutput& fwd, int64_t first, int64_t count);

  // Decode steps (one token per sequence, every sequence sampling) of up to the largest bucket
  // replay a CUDA graph captured for the smallest bucket that holds them, padded; other steps run
  // as before. Captured at the first such step, after the weights have their final storage:
  // reset_cuda_graphs() after anything rebinds a parameter (in-place weight updates need nothing).
  // Throws std::invalid_argument off CUDA.
  void enable_cuda_graphs(std::vector<int64_t> buckets, int64_t max_model_len);
  void reset_cuda_graphs();
  // Captured graphs: the base model's, and those of batches with adapted rows (LoRA).
  int64_t num_cuda_graphs() const {
    return static_cast<int64_t>(graphs_.size() + lora_graphs_.size());
  }
  int64_t num_lora_cuda_graphs() const { return static_cast<int64_t>(lora_graphs_.size()); }
  int64_t num_cuda_graph_captures() const { return graph_captures_; }  // over the runner's life

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t kv_cache_bytes() const {
    return kv_released_ ? 0 : kv_cache_.numel() * kv_cache_.element_size();
  }
  // The colocated hand-over (docs/design.md §5): gives the KV pool's memory back, and
  // restore_kv_cache() takes it again, zeroed. On a GPU the pool and the decode graphs reading it
  // are freed and the device's cached memory returned; the pool is allocated anew and the graphs
  // captured again at the next decode step. On the CPU the pool's pages are dropped in place
  // (drop_host_pages): the address stays, the memory comes back a page at a time as blocks are
  // written, so nothing is re-made. execute() refuses while it is released. REQUIRES for release:
  // no block holds a live sequence (the caller's contract).
  void release_kv_cache();
  void restore_kv_cache();
  bool kv_cache_released() const { return kv_released_; }
  const at::Tensor& kv_cache() const { return kv_cache_; }
  // The LoRA slots the rows' requests name (Request::lora_slot); nullptr = none. Not owned. A
  // decode step with an adapted row replays a LoRA graph (the masked product for every row,
  // whatever the mix of slots; captured at the first such step); eagerly, one adapter for every row
  // takes its own product instead (rounding differs, to cuBLAS's tolerance).
  void set_lora_slots(const LoraSlots* slots) { lora_ = slots; }

  // Tensor parallelism (docs/design.md §4): `group` (not owned; it outlives the runner) holds the
  // runners of the other shards of this runner's model, which all-reduces over it. The leader
  // (group rank 0) runs as without it and broadcasts each step's packed inputs, and each release
  // and restore of the pool, to the others; they run follow(). Steps run eagerly (no decode
  // graphs) and without LoRA slots. Set once, before the first step, on every rank.
  // (vLLM's driver worker broadcasting the scheduler's output, with the step already packed.)
  // `full`: the whole model's config (the shard's weight updates are laid out by it).
  void set_tensor_parallel(sync::TpGroup* group, const ModelConfig& full);
  // A follower's loop: runs the leader's steps, releases and restores until the leader's
  // stop_followers(). Throws what a collective throws (a leader gone: the group's deadline, naming
  // the op, the group, the ranks and the bytes).
  // `plan_lanes` (in-process groups): moves this rank's weights into sync buckets of its own and
  // registers them with the leader (the leader's plan_tp_lanes()).
  void follow(const std::function<void(int64_t bucket_bytes)>& plan_lanes = {});
  // The leader: ends the followers' loops (once; the destructor does it too, errors swallowed).
  void stop_followers();
  bool tensor_parallel() const { return tp_ != nullptr; }
  // Weight updates into the group (TpWeightLanding), on the leader: attach_tp_weights() plans the
  // whole model's sync layout over `bucket_bytes` on every rank (once); land_weights() hands a
  // received bucket's bytes to every rank, which copies its slices of the bucket's tensors into
  // its shard, and returns once every rank has (the caller may then reuse `bytes`). Between two
  // steps, on the engine thread. A rank that fails ends the group as a failed step does.
  const sync::WeightLayout& attach_tp_weights(int64_t bucket_bytes);
  // Sync lanes instead (LlmEngine::attach_weight_lanes): tells every follower to run its
  // plan_lanes(bucket_bytes) and returns once every rank has. A rank that fails ends the group.
  void plan_tp_lanes(int64_t bucket_bytes);
  // The leader, before it writes into the followers' weights: returns once every follower has
  // finished the last step and waits for the next command. Throws (the group broken) as a step.
  void quiesce_followers();
  // After a failed step or landing the group takes no further one (the followers may be inside
  // its collectives): std::runtime_error naming the group and the failure.
  void throw_if_group_broken() const;
  void land_weights(int64_t bucket, const at::Tensor& bytes);

 private:
  struct DecodeGraph;
  DecodeGraph* graph_for(const SchedulerOutput& batch);
  void allocate_kv_cache();
  void capture_cuda_graphs(bool lora);
  ForwardOutput execute_graph(const SchedulerOutput& batch, DecodeGraph& graph);
  // The forward of a packed step (on the model's device), copy-on-write copies first.
  at::Tensor run_packed(const StepLayout& layout, const Filled& filled, const at::Tensor& buf,
                        const LoraBatch& lora);
  // Plans this rank's TpWeightLanding; lands bucket `bucket` from `bytes`, then waits for the
  // group (every rank calls both, the followers on the leader's commands).
  void plan_tp_landing(int64_t bucket_bytes);
  void land_and_wait(int64_t bucket, const at::Tensor& bytes);
  // A barrier of the group (an all-reduce of one zero): returns once every rank is past its work.
  void wait_for_group();
  // The leader: the logits of `rows` (`which`: the first of the step's hidden rows, or its sample
  // rows), the followers told. gather_logits (every rank): this rank's part of the logits of
  // `rows`, gathered to the leader: [n, R, V / n] on `rows`' device there, undefined elsewhere.
  at::Tensor lead_logits(const at::Tensor& rows, int64_t which);
  at::Tensor gather_logits(const at::Tensor& rows);
  // The leader's word to its followers: a command and its numbers, and for a step the packed
  // inputs (host bytes).
  void tell_followers(const std::vector<int64_t>& words, const at::Tensor& payload = {});

  const Transformer& model_;
  int32_t block_size_;
  int32_t num_blocks_;
  at::Tensor kv_cache_;
  bool kv_released_ = false;
  std::vector<int64_t> graph_buckets_;  // ascending; empty: no graphs
  int64_t graph_max_blocks_ = 0;
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;  // by bucket, ascending; captured lazily
  std::vector<std::unique_ptr<DecodeGraph>>
      lora_graphs_;  // the same, for batches with adapted rows
  int64_t graph_captures_ = 0;
  const LoraSlots* lora_ = nullptr;
  sync::TpGroup* tp_ = nullptr;
  ModelConfig tp_full_;
  std::unique_ptr<TpWeightLanding> tp_landing_;
  bool followers_stopped_ = false;
  std::string tp_broken_;   // a failed step's error: the group takes no further step
  ForwardOutput followed_;  // a follower: the hidden states and sample rows of the last step
};

}  // namespace crl::engine

// Scheduler: continuous batching over the paged KV cache.
//
// Owns: the waiting queue, the running list (ordered oldest request first) and the BlockAllocator.
// Every step it builds one mixed batch under a token budget (max_batched_tokens) and a sequence
// cap (max_seqs):
//   1. running sequences, oldest first, each get their remaining tokens (1 for decode, a chunk of
//      a long prompt otherwise) while the budget lasts; when blocks run out the newest running
//      sequence is preempted (its blocks freed; it is recomputed later);
//   2. if nothing was preempted, waiting sequences are admitted FCFS: full prompt blocks found in
//      the prefix cache are reused, the rest is prefilled in chunks.
// Copy-on-write: a block about to be written while shared (the n samples after a fork) is copied
// first; the copies are returned so the ModelRunner can do them before the forward.
// Prefix caching: full blocks computed under the current weight version are registered under a
// hash chain that includes that version, so KV from older weights is never reused. A sequence
// that finishes also registers its last, unfilled block as a partial entry (its computed slots:
// every id but the last sampled one), so the next turn of a conversation, whose prompt is this
// sequence's ids and more, reuses all of them: it takes the partial block over (the entry is
// dropped before the block is written; copied first, as any shared block, when another sequence
// holds it) and prefills from there. After the forward and the sampler, postprocess() does the
// step's bookkeeping (nano-vllm's split): it appends the sampled tokens, forks a request's n
// samples at its first, and finishes what stops. on_weight_update() applies the in-flight policy
// when new weights land. Static batching (a benchmark baseline only) is a policy here: a finished
// sample keeps decoding as padding until every running sequence is padding, and no request is
// admitted meanwhile.
//
// Thread safety: none; only the engine thread calls it.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/engine_config.h"
#include "engine/sampler.h"
#include "engine/sequence.h"
#include "kv/block_allocator.h"

namespace crl::engine {

struct SchedulerConfig {
  // Tokens per KV block.
  int32_t block_size = 16;
  // Blocks in the KV pool.
  int32_t num_blocks = 0;
  // Token budget of one step (prefill chunks + decodes).
  int64_t max_batched_tokens = 2048;
  // Sequences in the running batch at most.
  int32_t max_seqs = 256;
  // Reuse full blocks across requests with equal prefixes.
  bool enable_prefix_caching = true;
  // Baseline only: admit a new wave of requests only when every running sequence is still in its
  // prefill (the engine keeps finished sequences decoding as padding until the wave ends).
  bool static_batching = false;
  // Order each step's batch by LoRA slot (stable): the forward runs each slot's rows as one run.
  // Nothing downstream depends on the order (sampling is seeded per request and position).
  bool group_lora_rows = false;

  void validate() const;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t start = 0;       // first position computed in this step
  int64_t num_tokens = 0;  // positions [start, start + num_tokens)
  bool sample = false;     // the chunk reaches the last token: sample the next one
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  std::vector<std::pair<kv::BlockId, kv::BlockId>> block_copies;  // (src, dst), before the forward
  std::vector<Sequence*> preempted;
  int64_t num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

// What the sampler drew for one scheduled sequence whose chunk reached its last token: one sample,
// or, at the first sample of an unforked request with n > 1, all n (sample k is sample index k:
// the sequence keeps the first, the others are forked from it).
struct SeqSamples {
  Sequence* seq = nullptr;
  std::vector<SampleResult> samples;
};

class StopChecker;

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A fresh id for a new sequence (the engine's parents and the scheduler's forked children).
  int64_t new_seq_id() { return next_seq_id_++; }
  // Queues a sequence (status kWaiting, no blocks, num_computed 0) at the tail.
  void add(Sequence* seq);
  // Builds the next batch. `weight_version` keys the prefix-cache hashes.
  SchedulerOutput schedule(int64_t weight_version);
  // After the forward: advances num_computed and registers newly full blocks in the prefix cache.
  void complete_step(const SchedulerOutput& out, int64_t weight_version);
  // After the forward and the sampler: complete_step(), then the forks of first samples (children
  // share the parent's blocks), then every sampled token is appended with its log-probs and
  // `weight_version`, and each sample `stop` ends is finished. Requests it touched go in `touched`.
  void postprocess(const SchedulerOutput& batch, const std::vector<SeqSamples>& sampled,
                   int64_t weight_version, const StopChecker& stop,
                   std::unordered_set<Request*>& touched);
  // Ends a sequence with `reason` and frees its blocks. A padding sequence (static batching) is
  // cut back to its real tokens and keeps the reason it finished with.
  void finish(Sequence* seq, FinishReason reason);
  // New weights were installed: forgets the prefix cache and treats the sequences in flight by
  // `policy` (kRecompute: recompute_running(); kAbort: every unfinished sequence that made
  // progress restarts from its prompt, at the tail of the waiting queue).
  void on_weight_update(InflightPolicy policy);
  // Makes `child` share `parent`'s blocks (refs taken) and puts it in the running list.
  void fork(const Sequence& parent, Sequence* child);
  // Frees a sequence's blocks and removes it from the queues (finish and abort, in any state).
  void remove(Sequence* seq);
  // Forgets every prefix-cache entry (after a weight update, or on request).
  void reset_prefix_cache();
  // After a weight update (InflightPolicy::kRecompute): every running sequence frees its blocks
  // and goes back to the head of the waiting queue in its order, so its K/V is recomputed under
  // the new weights before it samples again. Not counted as preemptions.
  void recompute_running();

  // Blocks a sequence of `num_tokens` tokens needs.
  int64_t blocks_for(int64_t num_tokens) const;

  const SchedulerConfig& config() const { return config_; }
  const kv::BlockAllocator& allocator() const { return allocator_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const std::vector<Sequence*>& running() const { return running_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t num_prefix_hit_tokens() const { return num_prefix_hit_tokens_; }
  int64_t num_generated_tokens() const { return num_generated_tokens_; }

 private:
  // Reserves blocks for positions [num_computed, end) (copy-on-write of a shared partial block
  // included). All or nothing: false when the pool cannot provide them.
  bool reserve(Sequence* seq, int64_t end, SchedulerOutput& out);
  void preempt(Sequence* seq, SchedulerOutput& out);
  void release_blocks(Sequence* seq);
  // Reuses cached full blocks of the sequence's tokens, then the longest cached partial block
  // after them; returns the number of tokens covered.
  int64_t match_prefix(Sequence* seq, int64_t weight_version);
  kv::BlockHash block_hash(Sequence* seq, int64_t block_index, int64_t weight_version);
  // The hash a block's chain starts from: the previous full block's, or the root's (salted by
  // the request's adapter) for block 0.
  kv::BlockHash parent_hash(Sequence* seq, int64_t block_index, int64_t weight_version);
  // The partial entry of `seq`'s first `num_tokens` ids of block `block_index`.
  kv::BlockHash partial_hash(Sequence* seq, int64_t block_index, int64_t num_tokens,
                             int64_t weight_version);
  // A sequence that ends normally leaves its last, unfilled block as a partial entry.
  void register_tail(Sequence* seq, int64_t weight_version);
  void insert_running(Sequence* seq);
  // Appends one sampled token to `seq` and finishes it when `stop` says so.
  void append(Sequence* seq, const SampleResult& res, int64_t weight_version,
              const StopChecker& stop);

  SchedulerConfig config_;
  kv::BlockAllocator allocator_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // sorted by (request arrival, sample index)
  int64_t num_preemptions_ = 0;
  int64_t num_prefix_hit_tokens_ = 0;
  int64_t num_generated_tokens_ = 0;
  int64_t next_seq_id_ = 0;
};

}  // namespace crl::engine

#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/check.h"
#include "engine/stop_checker.h"

namespace crl::engine {

namespace {
constexpr kv::BlockHash kRootHash = 0x9e3779b97f4a7c15ULL;

bool older(const Sequence* a, const Sequence* b) {
  if (a->request->arrival != b->request->arrival) return a->request->arrival < b->request->arrival;
  return a->sample_index < b->sample_index;
}
}  // namespace

void SchedulerConfig::validate() const {
  auto bad = [](const std::string& field, int64_t v, const char* rule) {
    throw std::invalid_argument("invalid scheduler setting '" + field + "': " + std::to_string(v) +
                                " (" + rule + ")");
  };
  if (block_size < 1 || block_size > 1024) bad("block_size", block_size, "must be in [1, 1024]");
  if (num_blocks < 1) bad("num_blocks", num_blocks, "the KV pool must hold at least one block");
  if (max_batched_tokens < 1) bad("max_batched_tokens", max_batched_tokens, "must be >= 1");
  if (max_seqs < 1) bad("max_seqs", max_seqs, "must be >= 1");
}

Scheduler::Scheduler(SchedulerConfig config)
    : config_((config.validate(), config)), allocator_(config.num_blocks) {}

int64_t Scheduler::blocks_for(int64_t num_tokens) const {
  return (num_tokens + config_.block_size - 1) / config_.block_size;
}

void Scheduler::add(Sequence* seq) {
  CRL_CHECK(seq->block_table.empty() && seq->num_computed == 0, "seq ", seq->seq_id);
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::insert_running(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  auto it = std::upper_bound(running_.begin(), running_.end(), seq, older);
  running_.insert(it, seq);
}

void Scheduler::release_blocks(Sequence* seq) {
  for (auto it = seq->block_table.rbegin(); it != seq->block_table.rend(); ++it) {
    allocator_.release(*it);  // tail first: the prompt's blocks stay cached longest
  }
  seq->block_table.clear();
  seq->num_computed = 0;
  seq->num_registered_blocks = 0;
  seq->partial_tail = false;
}

void Scheduler::remove(Sequence* seq) {
  release_blocks(seq);
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
}

void Scheduler::preempt(Sequence* seq, SchedulerOutput& out) {
  if (seq->padding) {  // static batching: filler is never recomputed
    num_preemptions_++;
    out.preempted.push_back(seq);
    finish(seq, seq->finish_reason);
    return;
  }
  release_blocks(seq);
  auto r = std::find(running_.begin(), running_.end(), seq);
  CRL_CHECK(r != running_.end(), "preempting a sequence that is not running");
  running_.erase(r);
  seq->status = SeqStatus::kWaiting;
  seq->num_preemptions++;
  waiting_.push_front(seq);
  out.preempted.push_back(seq);
  num_preemptions_++;
}

void Scheduler::fork(const Sequence& parent, Sequence* child) {
  child->block_table = parent.block_table;
  for (kv::BlockId b : child->block_table) allocator_.add_ref(b);
  child->num_computed = parent.num_computed;
  child->block_hashes = parent.block_hashes;
  child->hashes_version = parent.hashes_version;
  child->kv_version = parent.kv_version;
  child->num_registered_blocks = parent.num_registered_blocks;
  child->num_cached_prompt_tokens = parent.num_cached_prompt_tokens;
  insert_running(child);
}

void Scheduler::reset_prefix_cache() { allocator_.reset_prefix_cache(); }

void Scheduler::finish(Sequence* seq, FinishReason reason) {
  if (seq->padding) {
    seq->tokens.resize(seq->prompt_len() + seq->raw_logprobs.size());
    reason = seq->finish_reason;
    seq->padding = false;
  }
  seq->finish_reason = reason;
  seq->status = SeqStatus::kFinished;
  remove(seq);
}

void Scheduler::on_weight_update(InflightPolicy policy) {
  reset_prefix_cache();
  if (policy == InflightPolicy::kRecompute) {
    recompute_running();
  } else if (policy == InflightPolicy::kAbort) {
    std::vector<Sequence*> live(running_.begin(), running_.end());
    live.insert(live.end(), waiting_.begin(), waiting_.end());
    for (Sequence* seq : live) {
      if (seq->num_generated() == 0 && seq->num_computed == 0) continue;
      remove(seq);
      seq->clear_generated();
      add(seq);
    }
  }
}

void Scheduler::postprocess(const SchedulerOutput& batch, const std::vector<SeqSamples>& sampled,
                            int64_t weight_version, const StopChecker& stop,
                            std::unordered_set<Request*>& touched) {
  complete_step(batch, weight_version);
  // Fork first, while the parent still holds its blocks and prompt state.
  std::vector<std::vector<Sequence*>> targets(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sequence* parent = sampled[i].seq;
    Request* req = parent->request;
    targets[i].push_back(parent);
    for (size_t k = 1; k < sampled[i].samples.size(); ++k) {
      auto child = std::make_unique<Sequence>();
      child->seq_id = new_seq_id();
      child->request = req;
      child->sample_index = static_cast<int32_t>(k);
      child->tokens = parent->tokens;
      fork(*parent, child.get());
      targets[i].push_back(child.get());
      req->seqs.push_back(std::move(child));
    }
  }
  for (size_t i = 0; i < sampled.size(); ++i) {
    for (size_t k = 0; k < targets[i].size(); ++k) {
      append(targets[i][k], sampled[i].samples[k], weight_version, stop);
      touched.insert(targets[i][k]->request);
    }
  }
  for (const SeqSamples& s : sampled) s.seq->request->forked = true;  // n > 1 forks only once
  // Static batching: the wave ends when every running sequence is padding.
  if (config_.static_batching && !running_.empty()) {
    bool all_padding = true;
    for (const Sequence* s : running_) all_padding = all_padding && s->padding;
    if (all_padding) {
      std::vector<Sequence*> wave(running_.begin(), running_.end());
      for (Sequence* s : wave) finish(s, s->finish_reason);
    }
  }
}

void Scheduler::append(Sequence* seq, const SampleResult& res, int64_t weight_version,
                       const StopChecker& stop) {
  seq->tokens.push_back(res.token);
  const bool at_context_end = static_cast<int64_t>(seq->tokens.size()) >= stop.max_model_len();
  if (seq->padding) {  // static-batching baseline: the token is discarded
    if (at_context_end) finish(seq, seq->finish_reason);
    return;
  }
  num_generated_tokens_++;
  // A request kept on an older policy adapter version records that version (LoRA RL).
  const int64_t pv = seq->request->policy_version;
  seq->token_versions.push_back(pv >= 0 ? pv : weight_version);
  seq->raw_logprobs.push_back(res.raw_logprob);
  seq->processed_logprobs.push_back(res.processed_logprob);
  if (seq->request->params.logprobs > 0) seq->top_logprobs.push_back(res.top_logprobs);
  const FinishReason reason = stop.check(seq, res.token);
  if (reason == FinishReason::kNone) return;
  seq->finish_reason = reason;
  if (config_.static_batching && !at_context_end) {
    seq->padding = true;  // keeps decoding until its wave ends
  } else {
    register_tail(seq, weight_version);
    finish(seq, reason);
  }
}

void Scheduler::recompute_running() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {  // newest first to the front
    release_blocks(*it);
    (*it)->status = SeqStatus::kWaiting;
    waiting_.push_front(*it);
  }
  running_.clear();
}

kv::BlockHash Scheduler::parent_hash(Sequence* seq, int64_t index, int64_t version) {
  // An adapter's KV differs from the base's: its uid salts the chain (0, the base, leaves it).
  return index == 0 ? kRootHash ^ (seq->request->lora_uid * 0xbf58476d1ce4e5b9ULL)
                    : block_hash(seq, index - 1, version);
}

kv::BlockHash Scheduler::partial_hash(Sequence* seq, int64_t index, int64_t num_tokens,
                                      int64_t version) {
  CRL_CHECK(num_tokens > 0 && num_tokens < config_.block_size &&
                index * config_.block_size + num_tokens <= static_cast<int64_t>(seq->tokens.size()),
            "partial entry of ", num_tokens, " ids at block ", index);
  // The salt keeps partial and full entries apart even where a hash could coincide.
  return kv::BlockAllocator::hash_block(parent_hash(seq, index, version) ^ 0x5851f42d4c957f2dULL,
                                        seq->tokens.data() + index * config_.block_size,
                                        static_cast<int32_t>(num_tokens), version);
}

void Scheduler::register_tail(Sequence* seq, int64_t version) {
  const int64_t bs = config_.block_size;
  const int64_t k = seq->num_computed % bs;
  const int64_t index = seq->num_computed / bs;
  // Only a block this sequence alone holds, computed under the current weights: nobody else can
  // write its slots once it is free (allocate() evicts the entry first).
  if (!config_.enable_prefix_caching || k == 0 || seq->kv_version != version ||
      index >= static_cast<int64_t>(seq->block_table.size()) ||
      allocator_.ref_count(seq->block_table[index]) != 1) {
    return;
  }
  allocator_.register_partial(seq->block_table[index], partial_hash(seq, index, k, version));
}

kv::BlockHash Scheduler::block_hash(Sequence* seq, int64_t index, int64_t version) {
  if (seq->hashes_version != version) {
    seq->block_hashes.clear();
    seq->hashes_version = version;
  }
  const int64_t bs = config_.block_size;
  while (static_cast<int64_t>(seq->block_hashes.size()) <= index) {
    const int64_t i = static_cast<int64_t>(seq->block_hashes.size());
    CRL_CHECK((i + 1) * bs <= static_cast<int64_t>(seq->tokens.size()), "hashing a partial block");
    const kv::BlockHash parent = i == 0 ? parent_hash(seq, 0, version) : seq->block_hashes[i - 1];
    seq->block_hashes.push_back(
        kv::BlockAllocator::hash_block(parent, seq->tokens.data() + i * bs, bs, version));
  }
  return seq->block_hashes[index];
}

int64_t Scheduler::match_prefix(Sequence* seq, int64_t version) {
  if (!config_.enable_prefix_caching || seq->request->params.prompt_logprobs.has_value()) return 0;
  const int64_t len = static_cast<int64_t>(seq->tokens.size());
  // At least the last token is computed: its logits are needed.
  const int64_t max_blocks = (len - 1) / config_.block_size;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto hit = allocator_.lookup_cached(block_hash(seq, i, version));
    if (!hit) break;
    seq->block_table.push_back(*hit);
  }
  const int64_t hits = static_cast<int64_t>(seq->block_table.size());
  seq->num_computed = hits * config_.block_size;
  seq->num_registered_blocks = hits;
  // The next block, partly: the longest cached partial entry (its entry dropped in reserve()).
  const int64_t room = std::min<int64_t>(config_.block_size - 1, len - 1 - seq->num_computed);
  for (int64_t k = room; k > 0; --k) {
    auto hit = allocator_.lookup_partial(partial_hash(seq, hits, k, version));
    if (!hit) continue;
    seq->block_table.push_back(*hit);
    seq->partial_tail = true;
    seq->num_computed += k;
    break;
  }
  return seq->num_computed;
}

bool Scheduler::reserve(Sequence* seq, int64_t end, SchedulerOutput& out) {
  const int64_t bs = config_.block_size;
  const int64_t have = static_cast<int64_t>(seq->block_table.size());
  const int64_t need_total = blocks_for(end);
  int64_t need_new = std::max<int64_t>(0, need_total - have);
  // The block receiving position num_computed may hold earlier positions and be shared.
  const int64_t first = seq->num_computed / bs;
  const bool cow = first < have && allocator_.ref_count(seq->block_table[first]) > 1;
  if (!allocator_.can_allocate(static_cast<int32_t>(need_new + (cow ? 1 : 0)))) return false;
  if (seq->partial_tail) {
    // A cached partial block about to be written: its entry goes first, so no later lookup trusts
    // slots this sequence overwrites (held by another too, it is also copied just below).
    allocator_.drop_partial(seq->block_table[first]);
    seq->partial_tail = false;
  }
  if (cow) {
    const kv::BlockId src = seq->block_table[first];
    const kv::BlockId dst = *allocator_.allocate();
    out.block_copies.emplace_back(src, dst);
    allocator_.release(src);  // read before the forward writes anything (ModelRunner)
    seq->block_table[first] = dst;
  }
  for (int64_t i = 0; i < need_new; ++i) seq->block_table.push_back(*allocator_.allocate());
  return true;
}

SchedulerOutput Scheduler::schedule(int64_t version) {
  SchedulerOutput out;
  int64_t budget = config_.max_batched_tokens;

  // 1. Running sequences, oldest first; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t take = std::min(seq->num_uncomputed(), budget);
    if (take <= 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!reserve(seq, seq->num_computed + take, out)) {
      Sequence* victim = running_.back();
      preempt(victim, out);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // seq was the newest: nothing after it is left to schedule
    out.seqs.push_back({seq, seq->num_computed, take,
                        seq->num_computed + take == static_cast<int64_t>(seq->tokens.size())});
    budget -= take;
    ++i;
  }

  // 2. Admit waiting sequences FCFS unless this step had to preempt.
  bool may_admit = out.preempted.empty();
  if (config_.static_batching) {
    for (const Sequence* s : running_) {
      if (s->num_generated() > 0 || s->padding) may_admit = false;
    }
  }
  while (may_admit && !waiting_.empty() && budget > 0) {
    Sequence* seq = waiting_.front();
    // An unforked request will run n sequences after its first sample: count them all (a request
    // with n > max_seqs is admitted alone).
    const Request* req = seq->request;
    const int32_t width = req->forked ? 1 : req->params.n;
    if (!running_.empty() && static_cast<int32_t>(running_.size()) + width > config_.max_seqs)
      break;
    const int64_t cached = match_prefix(seq, version);
    const int64_t take = std::min(seq->num_uncomputed(), budget);
    if (!reserve(seq, seq->num_computed + take, out)) {
      release_blocks(seq);  // give the prefix hits back (they stay cached)
      break;
    }
    waiting_.pop_front();
    seq->num_cached_prompt_tokens = std::min<int64_t>(cached, seq->prompt_len());
    seq->kv_version = version;
    num_prefix_hit_tokens_ += cached;
    insert_running(seq);
    out.seqs.push_back({seq, seq->num_computed, take,
                        seq->num_computed + take == static_cast<int64_t>(seq->tokens.size())});
    budget -= take;
  }

  if (config_.group_lora_rows) {
    std::stable_sort(out.seqs.begin(), out.seqs.end(),
                     [](const ScheduledSeq& a, const ScheduledSeq& b) {
                       return a.seq->request->lora_slot < b.seq->request->lora_slot;
                     });
  }
  for (const auto& s : out.seqs) out.num_tokens += s.num_tokens;
  return out;
}

void Scheduler::complete_step(const SchedulerOutput& out, int64_t version) {
  const int64_t bs = config_.block_size;
  for (const ScheduledSeq& s : out.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed = s.start + s.num_tokens;
    if (!config_.enable_prefix_caching || seq->kv_version != version) continue;
    while ((seq->num_registered_blocks + 1) * bs <= seq->num_computed) {
      const int64_t i = seq->num_registered_blocks;
      allocator_.register_hash(seq->block_table[i], block_hash(seq, i, version));
      seq->num_registered_blocks++;
    }
  }
}

}  // namespace crl::engine

// Scheduler tests without a model: tokens are drawn at random instead of by a sampler.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <unordered_set>

#include "engine/stop_checker.h"

namespace crl::engine {
namespace {

struct Harness {
  explicit Harness(SchedulerConfig c) : sched(c) {}

  StopChecker stop{/*tokenizer=*/nullptr, /*eos_ids=*/{}, /*max_model_len=*/1 << 30};

  // A prompt of `prompt_len` ids derived from the length (equal lengths, equal prompts).
  Sequence* add(int prompt_len, int max_tokens, int n = 1) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < prompt_len; ++i)
      prompt.push_back(static_cast<int32_t>(prompt_len * 7 + i % 5));
    return add_ids(std::move(prompt), max_tokens, n);
  }

  Sequence* add_ids(std::vector<int32_t> prompt, int max_tokens, int n = 1) {
    auto req = std::make_unique<Request>();
    req->id = std::to_string(next_arrival);
    req->arrival = next_arrival++;
    req->params.n = n;
    req->params.max_tokens = max_tokens;
    req->prompt = std::move(prompt);
    auto seq = std::make_unique<Sequence>();
    seq->request = req.get();
    seq->tokens = req->prompt;
    seq->seq_id = next_seq++;
    Sequence* s = seq.get();
    req->seqs.push_back(std::move(seq));
    sched.add(s);
    requests.push_back(std::move(req));
    return s;
  }

  // One step as the engine takes it: schedule, then postprocess with a random token for every
  // sample (all n at an unforked request's first), which forks, appends and finishes.
  SchedulerOutput step(std::mt19937& rng) {
    SchedulerOutput out = sched.schedule(0);
    std::vector<SeqSamples> sampled;
    for (const auto& s : out.seqs) {
      if (!s.sample) continue;
      const Request* req = s.seq->request;
      SeqSamples ss;
      ss.seq = s.seq;
      ss.samples.resize(!req->forked && req->params.n > 1 ? req->params.n : 1);
      for (auto& r : ss.samples) r.token = static_cast<int32_t>(rng() % 500);
      sampled.push_back(std::move(ss));
    }
    std::unordered_set<Request*> touched;
    sched.postprocess(out, sampled, 0, stop, touched);
    return out;
  }

  void finish(Sequence* seq) { sched.finish(seq, FinishReason::kAbort); }

  void check() const {
    const auto& a = sched.allocator();
    ASSERT_EQ(a.num_free_blocks() + a.num_used_blocks(), a.num_blocks());
    a.check_invariants();
    int64_t held = 0;
    for (const auto& r : requests) {
      for (const auto& s : r->seqs) {
        for (auto b : s->block_table) {
          ASSERT_GT(a.ref_count(b), 0);
          held++;
        }
      }
    }
    int64_t refs = 0;
    for (int32_t b = 0; b < a.num_blocks(); ++b) refs += a.ref_count(b);
    ASSERT_EQ(refs, held) << "every reference belongs to exactly one block-table entry";
  }

  Scheduler sched;
  std::vector<std::unique_ptr<Request>> requests;
  int64_t next_arrival = 0;
  int64_t next_seq = 0;
};

// `ids` followed by `count` new ids from `first` on (a conversation's next turn).
std::vector<int32_t> then_new(std::vector<int32_t> ids, int count, int32_t first) {
  for (int i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 32;
  c.max_batched_tokens = 16;
  c.max_seqs = 8;
  return c;
}

TEST(SchedulerTest, ChunksLongPromptsUnderTheTokenBudget) {
  Harness h(small_config());
  std::mt19937 rng(1);
  Sequence* s = h.add(40, 2);
  auto out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].num_tokens, 16);
  EXPECT_FALSE(out.seqs[0].sample);
  h.step(rng);
  out = h.step(rng);
  EXPECT_EQ(out.seqs[0].num_tokens, 8);
  EXPECT_TRUE(out.seqs[0].sample);
  EXPECT_EQ(s->num_generated(), 1);
}

TEST(SchedulerTest, MixesDecodesWithPrefillChunksOfSeveralPrompts) {
  Harness h(small_config());
  std::mt19937 rng(2);
  h.add(3, 10);
  h.step(rng);  // prefill of the first request
  h.add(10, 2);
  h.add(10, 2);
  auto out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 3u);
  EXPECT_EQ(out.seqs[0].num_tokens, 1);   // decode first
  EXPECT_EQ(out.seqs[1].num_tokens, 10);  // a whole prompt
  EXPECT_EQ(out.seqs[2].num_tokens, 5);   // the rest of the budget: a chunk
  EXPECT_FALSE(out.seqs[2].sample);
  out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 3u);
  EXPECT_EQ(out.seqs[1].num_tokens, 1);
  EXPECT_EQ(out.seqs[2].num_tokens, 5);
  EXPECT_TRUE(out.seqs[2].sample);
}

TEST(SchedulerTest, PreemptsTheNewestSequenceWhenBlocksRunOut) {
  SchedulerConfig c = small_config();
  c.num_blocks = 6;
  Harness h(c);
  std::mt19937 rng(3);
  Sequence* old_seq = h.add(8, 20);
  Sequence* new_seq = h.add(8, 20);
  int64_t preempted = 0;
  for (int i = 0; i < 6; ++i) preempted += static_cast<int64_t>(h.step(rng).preempted.size());
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(new_seq->status, SeqStatus::kWaiting);
  EXPECT_EQ(old_seq->status, SeqStatus::kRunning);
  EXPECT_TRUE(new_seq->block_table.empty());
  h.check();
}

TEST(SchedulerTest, ReusesCachedPrefixBlocksAndComputesAtLeastTheLastToken) {
  Harness h(small_config());
  std::mt19937 rng(4);
  Sequence* a = h.add(12, 1);
  while (h.sched.has_work()) h.step(rng);
  EXPECT_EQ(a->status, SeqStatus::kFinished);
  Sequence* b = h.add(12, 1);  // same prompt (the harness derives tokens from the length)
  auto out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start, 8) << "two full blocks hit; the third holds the last token";
  EXPECT_EQ(b->num_cached_prompt_tokens, 8);
}

// The next turn of a conversation: a prompt of the earlier sequence's ids and more reuses every
// id the earlier one computed (all but its last sample), its unfilled last block taken over (the
// entry dropped before the block is written).
TEST(SchedulerTest, ALaterTurnTakesOverTheEarlierTurnsPartialLastBlock) {
  Harness h(small_config());
  std::mt19937 rng(5);
  Sequence* a = h.add(10, 4);  // 13 ids computed at the end: 3 full blocks and 1 of 4
  while (h.sched.has_work()) h.step(rng);
  ASSERT_EQ(a->status, SeqStatus::kFinished);
  ASSERT_EQ(a->tokens.size(), 14u);
  EXPECT_EQ(h.sched.allocator().num_partial_entries(), 1);
  Sequence* b = h.add_ids(then_new(a->tokens, 6, 900), 1);  // the earlier turn as sampled, new text
  auto out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start, 13) << "3 full blocks and the 1 computed id of the fourth";
  EXPECT_EQ(b->num_cached_prompt_tokens, 13);
  EXPECT_TRUE(out.block_copies.empty()) << "its only holder writes it in place";
  EXPECT_EQ(h.sched.allocator().num_partial_entries(), 0)
      << "the entry goes before the block is written";
  h.check();
  // A prompt that differs inside the partial block gets the full blocks only.
  std::vector<int32_t> edited(a->tokens.begin(), a->tokens.begin() + 12);
  edited.push_back(a->tokens[12] + 1);
  Sequence* c = h.add_ids(then_new(edited, 4, 950), 1);
  out = h.step(rng);
  bool found = false;
  for (const auto& s : out.seqs) {
    if (s.seq != c) continue;
    found = true;
    EXPECT_EQ(s.start, 12);
  }
  EXPECT_TRUE(found);
  while (h.sched.has_work()) h.step(rng);
  h.check();
  // New weights: the earlier turn's K/V is not reused, partial block included.
  h.sched.on_weight_update(InflightPolicy::kKeep);
  EXPECT_EQ(h.sched.allocator().num_partial_entries(), 0);
  h.add_ids(b->tokens, 1);
  out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start, 0);
  EXPECT_TRUE(out.block_copies.empty());
  while (h.sched.has_work()) h.step(rng);
  h.check();
}

// A prompt that needs the whole pool is admitted with a partial hit as without one (the hit
// costs no extra block).
TEST(SchedulerTest, APartialHitNeedsNoBlockMoreThanTheSequence) {
  SchedulerConfig c = small_config();
  c.num_blocks = 4;
  Harness h(c);
  std::mt19937 rng(6);
  Sequence* a = h.add(2, 2);  // 4 ids, 3 computed: a partial entry of 3
  while (h.sched.has_work()) h.step(rng);
  ASSERT_EQ(h.sched.allocator().num_partial_entries(), 1);
  Sequence* b = h.add_ids(then_new(a->tokens, 11, 700), 1);  // 15 ids + 1 sampled: all 4 blocks
  auto out = h.step(rng);
  ASSERT_EQ(out.seqs.size(), 1u) << "admitted at once";
  EXPECT_EQ(out.seqs[0].start, 3);
  while (h.sched.has_work()) h.step(rng);
  EXPECT_EQ(b->status, SeqStatus::kFinished);
  h.check();
}

TEST(SchedulerTest, PostprocessForksAtTheFirstSampleAndFinishesAtMaxTokens) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 32;
  Harness h(c);
  std::mt19937 rng(3);
  Sequence* parent = h.add(/*prompt_len=*/6, /*max_tokens=*/3, /*n=*/3);
  h.step(rng);  // prefill + first sample: forks
  const Request* req = parent->request;
  ASSERT_EQ(req->seqs.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(req->seqs[k]->sample_index, static_cast<int32_t>(k));
    EXPECT_EQ(req->seqs[k]->num_generated(), 1);
    EXPECT_EQ(req->seqs[k]->block_table[0], parent->block_table[0])
        << "the prompt's blocks are shared";
  }
  EXPECT_EQ(h.sched.num_generated_tokens(), 3);
  while (h.sched.has_work()) h.step(rng);
  for (const auto& seq : req->seqs) {
    EXPECT_TRUE(seq->is_finished());
    EXPECT_EQ(seq->finish_reason, FinishReason::kLength);
    EXPECT_EQ(seq->num_generated(), 3);
  }
  EXPECT_EQ(h.sched.allocator().num_used_blocks(), 0);
  h.check();
}

TEST(SchedulerTest, StaticBatchingPadsFinishedSamplesUntilTheWaveEnds) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 64;
  c.static_batching = true;
  Harness h(c);
  std::mt19937 rng(5);
  Sequence* short_one = h.add(/*prompt_len=*/5, /*max_tokens=*/2);
  Sequence* long_one = h.add(/*prompt_len=*/5, /*max_tokens=*/6);
  h.step(rng);
  h.step(rng);
  EXPECT_TRUE(short_one->padding) << "finished, still decoding as filler";
  EXPECT_FALSE(short_one->is_finished());
  Sequence* late = h.add(/*prompt_len=*/5, /*max_tokens=*/2);
  h.step(rng);
  EXPECT_EQ(late->status, SeqStatus::kWaiting) << "no admission while a wave runs";
  while (!long_one->is_finished()) h.step(rng);
  EXPECT_TRUE(short_one->is_finished());
  EXPECT_EQ(short_one->num_generated(), 2) << "padding tokens are cut off";
  EXPECT_EQ(short_one->finish_reason, FinishReason::kLength);
  h.step(rng);
  EXPECT_EQ(late->status, SeqStatus::kRunning) << "the next wave starts";
}

TEST(SchedulerTest, AbortPolicyOnAWeightUpdateRestartsEverySequenceThatMadeProgress) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 64;
  c.max_batched_tokens = 8;
  Harness h(c);
  std::mt19937 rng(7);
  Sequence* running = h.add(/*prompt_len=*/5, /*max_tokens=*/8);
  Sequence* waiting = h.add(/*prompt_len=*/9, /*max_tokens=*/8);
  h.step(rng);
  h.step(rng);
  ASSERT_GT(running->num_generated(), 0);
  h.sched.on_weight_update(InflightPolicy::kAbort);
  EXPECT_EQ(running->num_generated(), 0);
  EXPECT_EQ(running->num_computed, 0);
  EXPECT_TRUE(running->block_table.empty());
  EXPECT_EQ(running->status, SeqStatus::kWaiting);
  EXPECT_EQ(waiting->num_generated(), 0);
  EXPECT_EQ(h.sched.num_running(), 0u);
  EXPECT_EQ(h.sched.num_waiting(), 2u);
  EXPECT_EQ(h.sched.allocator().num_used_blocks(), 0);
  while (h.sched.has_work()) h.step(rng);
  EXPECT_EQ(running->num_generated(), 8);
  h.check();
}

TEST(SchedulerTest, RandomAddAbortPreemptKeepsTheBlockAccountingExact) {
  SchedulerConfig c = small_config();
  c.num_blocks = 40;
  Harness h(c);
  std::mt19937 rng(1234);
  int64_t preemptions = 0, aborts = 0;
  for (int op = 0; op < 4000; ++op) {
    const int r = static_cast<int>(rng() % 10);
    if (r < 3 && h.requests.size() < 400) {
      h.add(1 + static_cast<int>(rng() % 30), 1 + static_cast<int>(rng() % 30),
            1 + static_cast<int>(rng() % 3));
    } else if (r < 4 && !h.requests.empty()) {
      auto& req = h.requests[rng() % h.requests.size()];
      for (auto& s : req->seqs) {
        if (!s->is_finished()) {
          h.finish(s.get());
          aborts++;
        }
      }
    } else {
      preemptions += static_cast<int64_t>(h.step(rng).preempted.size());
    }
    h.check();
    if (HasFatalFailure()) return;
  }
  for (auto& req : h.requests) {
    for (auto& s : req->seqs) {
      if (!s->is_finished()) h.finish(s.get());
    }
  }
  h.check();
  EXPECT_EQ(h.sched.allocator().num_free_blocks(), c.num_blocks);
  EXPECT_GT(preemptions, 10);
  EXPECT_GT(aborts, 10);
}

}  // namespace
}  // namespace crl::engine

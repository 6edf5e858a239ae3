// Request and Sequence: per-request state of the engine.
//
// A Request owns its n Sequences. It starts with one sequence (the parent) that prefills the
// prompt; when the parent samples its first token the request forks: n - 1 children copy the
// parent's block table (taking references), so the prompt's KV blocks are computed once and shared;
// copy-on-write happens at the first block a child writes into while it is still shared.
//
// Only the engine thread touches these objects.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampling_params.h"
#include "kv/block_allocator.h"

namespace crl::engine {

enum class SeqStatus { kWaiting, kRunning, kFinished };

enum class FinishReason { kNone, kStop, kLength, kAbort };

const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", ""

struct Request;

struct Sequence {
  int64_t seq_id = 0;
  Request* request = nullptr;  // owner, not owned
  int32_t sample_index = 0;    // which of the request's n samples
  SeqStatus status = SeqStatus::kWaiting;
  std::vector<int32_t> tokens;              // prompt + generated
  int64_t num_computed = 0;                 // leading tokens whose K/V are in the cache
  std::vector<kv::BlockId> block_table;     // blocks holding positions [i*bs, (i+1)*bs)
  std::vector<kv::BlockHash> block_hashes;  // hash chain of the full blocks of `tokens`, cached
  int64_t hashes_version = -1;              // weight version block_hashes were computed with
  int64_t kv_version = -1;                  // weight version of the K/V in this sequence's blocks
  int64_t num_registered_blocks = 0;        // full blocks already registered in the prefix cache
  bool partial_tail = false;                // block_table.back() is a cached partial block: its
                                            // entry goes before it is written (Scheduler::reserve)
  int64_t num_cached_prompt_tokens = 0;     // prompt tokens served by the prefix cache at admission
  int64_t num_preemptions = 0;

  // Outputs, one entry per generated token.
  std::vector<float> raw_logprobs;        // log_softmax at temperature 1 over the full vocabulary
  std::vector<float> processed_logprobs;  // log-prob under the sampling distribution
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::vector<int64_t> token_versions;  // weight version that sampled each token
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;       // the stop token id that ended it
  std::optional<std::string> stop_string;  // the stop string that ended it
  std::string text;                        // detokenized completion (stop string cut)
  size_t stop_checked_chars = 0;           // completion text already searched for stop strings
  // Static-batching baseline only: finished, but keeps decoding as padding until its wave ends.
  bool padding = false;

  int64_t prompt_len() const;
  int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len(); }
  int64_t num_uncomputed() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
  bool is_finished() const { return status == SeqStatus::kFinished; }
  // Back to its prompt: every generated token and its outputs are dropped (InflightPolicy::kAbort).
  void clear_generated();
};

struct Request {
  std::string id;
  int64_t arrival = 0;  // admission order (FCFS and newest-first preemption)
  SamplingParams params;
  uint64_t seed = 0;  // params.seed or drawn by the engine
  std::vector<int32_t> prompt;
  std::vector<std::unique_ptr<Sequence>> seqs;
  bool forked = false;     // children created (after the parent's first sample)
  int32_t lora_slot = -1;  // LoRA slot its rows use (-1: the base model)
  uint64_t lora_uid = 0;   // that adapter's load id (salts its prefix-cache keys)
  // The weight version of the policy adapter version its rows use (LoraRegistry::attach_policy
  // with several versions); its sampled tokens record it. -1: the engine's current version.
  int64_t policy_version = -1;
  std::vector<int32_t> banned_until_min_tokens;  // EOS + stop ids masked before min_tokens
  // Prompt log-probs: entry i is for prompt token i + 1 (the first token has none).
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top_logprobs;
  std::string error;  // why the engine failed this request, if it did

  bool is_finished() const;
};

}  // namespace crl::engine

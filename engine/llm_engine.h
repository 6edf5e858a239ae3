// LlmEngine: the embedded generation API (add_request / step / abort / generate).
//
// Orchestrates Scheduler (policy, blocks), ModelRunner (KV tensors, forward), the sampler and the
// LoraRegistry (which slot serves which adapter); owns the Transformer and the Tokenizer.
//
// Thread safety: add_request() and abort() may be called from any thread (they go through a
// mutex-guarded inbox that step() drains). step(), generate() and every other method belong to
// one engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/engine_config.h"
#include "engine/lora_registry.h"
#include "engine/model/transformer.h"
#include "engine/model_runner.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/stop_checker.h"
#include "engine/weight_buffers.h"
#include "sync/weight_source.h"
#include "text/tokenizer.h"

namespace crl::engine {

class LocalTpFollowers;

struct GenerateRequest {
  // Unique id; empty = the engine assigns one.
  std::string request_id;
  // Text prompt, used when prompt_token_ids is empty (BOS added when the model wants one).
  std::string prompt;
  // Token-in: the prompt as ids, used as given.
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  // A LoRA adapter served by loras(), by name; empty = the base model (or the RL policy adapter).
  std::string lora;
};

struct CompletionOutput {
  int32_t index = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<float> raw_logprobs;
  std::vector<float> processed_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::vector<int64_t> token_versions;  // weight version that sampled each token
  // The log-probs of the distribution a request with only a `temperature` (no penalty or top_k /
  // top_p / min_p) drew its tokens from, an RL loss's behaviour policy: the raw ones at 1 (and
  // greedy), the processed ones otherwise (engine::tempered_logprobs recomputes them at T > 0).
  const std::vector<float>& sampled_logprobs(double temperature) const {
    return temperature == 1.0 || temperature == 0.0 ? raw_logprobs : processed_logprobs;
  }
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;
  std::optional<std::string> stop_string;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<float> prompt_logprobs;  // entry i: log p(prompt[i + 1] | prompt[..i])
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top_logprobs;
  std::vector<CompletionOutput> outputs;  // one per sample, by index
  bool finished = false;
  std::string error;  // set when the engine failed this request (finish: abort)
  // Weights that produced the oldest and the newest generated token of any sample (the engine's
  // version when none yet); they differ when an update landed while the request ran.
  int64_t weight_version = 0;
  int64_t first_weight_version = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill tokens actually run (cache hits excluded)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int32_t max_used_blocks = 0;
  // Host time per phase, summed over steps. On a device the forward only queues work (its time is
  // the launch cost) and sampling waits for it (its time holds the device's forward and sampler).
  double schedule_seconds = 0;  // the inbox, the scheduler, the prompt log-probs' host part
  double forward_seconds = 0;
  double sample_seconds = 0;
  double finish_seconds = 0;  // postprocessing (stop checks, block frees) and the outputs
  // Bytes copied between host and device (0 on a CPU engine): device->host is the sampled ids and
  // log-probs (the logits too with the "cpu" sampler on a device, prompt log-probs, an observer);
  // host->device is each step's metadata and sampling parameters.
  int64_t d2h_bytes = 0;
  int64_t h2d_bytes = 0;
  int64_t max_step_d2h_bytes = 0;  // the largest one step copied device->host
  // The colocated hand-over (release_kv_cache / restore_kv_cache): how often and how long.
  int64_t kv_releases = 0, kv_restores = 0;
  double kv_release_seconds = 0, kv_restore_seconds = 0;
};

// One engine step: its shape and its host time per phase (EngineStats' phases, this step only).
struct StepRecord {
  int64_t step = 0;  // EngineStats::steps after it
  int64_t seqs = 0;
  int64_t tokens = 0;          // rows of the forward
  int64_t prefill_tokens = 0;  // of which prompt tokens
  double schedule_seconds = 0, forward_seconds = 0, sample_seconds = 0, finish_seconds = 0;
};
// Called on the engine thread after every step that ran a forward (benchmarks' traces, profilers).
using StepObserver = std::function<void(const StepRecord&)>;

// Called on the engine thread with each row of logits the engine samples from: the request,
// the sample index of the sequence, the position of the sampled token, and logits [vocab] float32.
using LogitsObserver = std::function<void(const std::string& request_id, int32_t sample_index,
                                          int64_t position, const at::Tensor& logits)>;

class LlmEngine {
 public:
  // Tensor parallelism (docs/design.md §4): with config.tensor_parallel_size N > 1 the engine
  // starts N - 1 follower threads, each loading its shard on its own device and running follow()
  // over an in-process group, and stops them when destroyed. Or `tp` (not owned; it outlives the
  // engine): a group of ranks in other processes whose rank 0 this engine is, the others running
  // follow(). Refused with LoRA adapters and CUDA graphs forced on; its weight updates go through
  // attach_weight_lanes (in-process groups: each rank's shard in sync buckets of its own) or
  // attach_weight_layout (the whole model's buckets staged on this rank and sliced), not
  // attach_weight_buffers.
  explicit LlmEngine(const EngineConfig& config, sync::TpGroup* tp = nullptr);
  ~LlmEngine();
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Validates and queues a request; returns its id. Throws std::invalid_argument for bad
  // parameters, an empty prompt, out-of-vocabulary ids, or prompt + max_tokens over the context.
  std::string add_request(GenerateRequest request);
  // The checks of add_request without queuing anything: tokenizes a text prompt into
  // request.prompt_token_ids (BOS added when the model wants one) and throws what add_request
  // would throw (except for a duplicate id). Any thread: it reads only immutable state.
  void validate_request(GenerateRequest& request) const;
  // A text prompt as the engine tokenizes it (BOS first when the model wants one). Any thread.
  // Throws std::invalid_argument when the model has no tokenizer.
  // `split_special_tokens`: special-token literals in the text stay text (untrusted input).
  std::vector<int32_t> encode_prompt(const std::string& text,
                                     bool split_special_tokens = false) const;
  // The special tokens encode_prompt puts before a prompt's text (BOS, or nothing): the prefix of
  // prompts built from pieces (chats in a built-in format, the trainer's prompts). Any thread.
  std::vector<int32_t> prompt_prefix() const;
  // Aborts a request in any state; its blocks are freed at the next step. Unknown ids are ignored.
  void abort(const std::string& request_id);

  // Runs one scheduling + forward + sampling step. Returns an output for every request that
  // produced tokens or finished in this step (cumulative token lists).
  std::vector<RequestOutput> step();
  // A tensor-parallel group's other ranks (group rank > 0): load their shard of `config`'s model
  // (the group then agrees that every rank built its shard and that the KV pools match) and run
  // the leader's steps until its engine is destroyed. Throws what building or a collective throws.
  // Over a Communicator each wait for the leader's next command has the communicator's deadline,
  // so a leader idle for longer ends its followers (an in-process group waits without one).
  // `lanes`: an in-process group's board (LocalTpFollowers), where this rank puts its weight
  // buckets when the leader attaches sync lanes.
  static void follow(const EngineConfig& config, sync::TpGroup& tp, TpLaneBoard* lanes = nullptr);
  bool has_unfinished() const;

  // Adds the requests (all or none), steps until all of them finished, returns their outputs in
  // order. It drives step() itself: outputs of other requests finishing meanwhile are not
  // returned to anyone, so an engine shared with other submitters (the server) uses step().
  std::vector<RequestOutput> generate(std::vector<GenerateRequest> requests);

  // The LoRA adapters (EngineConfig::max_loras slots): add, load, names, the RL policy adapter.
  LoraRegistry& loras() { return *loras_; }
  const LoraRegistry& loras() const { return *loras_; }

  // Debug/test hook: observe every sampled logits row (empty function = off).
  void set_logits_observer(LogitsObserver observer) { observer_ = std::move(observer); }
  // Observe every step that ran a forward (empty function = off).
  void set_step_observer(StepObserver observer) { step_observer_ = std::move(observer); }

  // Moves the weights into sync buckets (once; later calls return the same buffers) so updates
  // are received in place. Engine thread only (or before an EngineLoop starts stepping the
  // engine); see WeightBuffers for the write contract. EngineLoop receives into them.
  WeightBuffers& attach_weight_buffers(int64_t bucket_bytes);
  WeightBuffers* weight_buffers() { return weight_buffers_.get(); }
  // The whole model's sync layout over `bucket_bytes` (once; later calls return the same): a
  // whole engine's weights move into sync buckets (attach_weight_buffers); a tensor-parallel
  // engine's shards stay as loaded, and each update's buckets are staged one at a time on this
  // rank, every rank of the group copying its slices out (TpWeightLanding). Engine thread only.
  const sync::WeightLayout& attach_weight_layout(int64_t bucket_bytes);
  // An in-process tensor-parallel engine (config.tensor_parallel_size > 1): every rank's shard
  // moves into sync buckets of its own, laid out by the shard's parameters (the same layout on
  // every rank, returned; once, later calls return the same), and each update is received into
  // all of them at once (WeightSource::receive_lanes): no rank receives another's slices.
  // Engine thread only. Throws std::invalid_argument for another engine, or after
  // attach_weight_layout.
  const sync::WeightLayout& attach_weight_lanes(int64_t bucket_bytes);
  // Every rank's weight buckets, by rank, after attach_weight_lanes (else empty): what sync-check
  // compares with the trainer's slices.
  const std::vector<std::vector<at::Tensor>>& lane_buckets() const { return lane_buckets_; }
  // Receives version `v` from `source` (into update_buckets(); a tensor-parallel group: over its
  // ranks' sync lanes, or staged and landed), then apply_weight_update(v, policy). What EngineLoop
  // does between two steps. Throws what the receive throws. Engine thread only.
  sync::SyncStats receive_weight_update(sync::WeightSource& source, int64_t v,
                                        InflightPolicy policy = InflightPolicy::kKeep);
  // Where a weight update is received: the policy adapter's buckets (RL with LoRA,
  // LoraRegistry::attach_policy), else the model's (attach_weight_buffers). Throws
  // std::logic_error when neither is attached. Engine thread only.
  std::vector<at::Tensor>& update_buckets();
  // What update_buckets() received is version `v` (the sender's number): loads the policy adapter's
  // new version into a slot (RL with LoRA), then set_weight_version(v, policy). What the engine
  // loop and the benchmarks do after each receive. Engine thread only.
  void apply_weight_update(int64_t v, InflightPolicy policy = InflightPolicy::kKeep);
  // The weights are version `v` (resumed runs start at the checkpoint's; apply_weight_update calls
  // it after each update). Drops prefix-cache entries and treats the sequences in flight by
  // `policy` (see InflightPolicy); tokens sampled from now on record `v`. Engine thread only.
  void set_weight_version(int64_t v, InflightPolicy policy = InflightPolicy::kKeep);
  // Forgets every prefix-cache entry (blocks in use are untouched). Engine thread only.
  void reset_prefix_cache();
  // The colocated hand-over (docs/design.md §5): frees the KV pool (and the decode graphs reading
  // it) and hands its memory back to the device while a trainer on the same GPU trains; the
  // prefix cache is forgotten with it. The next step with work allocates the pool again (or
  // restore_kv_cache(), explicitly). Throws std::logic_error while requests are in flight. Both
  // timed in stats(). Engine thread only.
  void release_kv_cache();
  void restore_kv_cache();
  bool kv_cache_released() const;
  int64_t weight_version() const { return weight_version_; }

  const ModelConfig& model_config() const { return model_->config(); }
  Transformer& model() { return *model_; }
  const Transformer& model() const { return *model_; }
  const text::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  const ModelRunner& runner() const { return *runner_; }
  const EngineStats& stats() const { return stats_; }
  const EngineConfig& config() const { return config_; }
  int64_t max_model_len() const { return max_model_len_; }
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }

 private:
  struct Inbox;
  // The scheduled batch's forward: the logits row of every sequence that samples, in batch order.
  struct BatchLogits {
    std::vector<Sequence*> seqs;
    at::Tensor logits;  // [seqs, vocab] float32: on the model's device for the tensor sampler,
                        // else on the CPU
  };
  // Admits the queued requests, applies the queued aborts; returns the requests those finished.
  std::unordered_set<Request*> drain_inbox();
  // Forward, sampling and postprocessing of a non-empty batch; a failure fails its requests.
  void run_batch(const SchedulerOutput& batch, std::unordered_set<Request*>& touched);
  // Adds the step's phase times to the stats and tells the step observer.
  void end_step(const SchedulerOutput& batch);
  // Forward (and prompt log-probs) of one scheduled batch.
  BatchLogits run(const SchedulerOutput& batch);
  // One sample per sequence; all n at the first sample of an unforked request with n > 1.
  std::vector<SeqSamples> sample(const BatchLogits& in);
  // Outputs of the requests a step touched; the finished ones are forgotten.
  std::vector<RequestOutput> collect_outputs(const std::unordered_set<Request*>& touched);
  // Finishes every request in `batch` with FinishReason::kAbort and `what` as its error.
  void fail_batch(const SchedulerOutput& batch, const std::string& what,
                  std::unordered_set<Request*>& touched);
  void admit(GenerateRequest&& request);
  void compute_prompt_logprobs(const ScheduledSeq& s, const ForwardOutput& fwd, int64_t row);
  RequestOutput make_output(const Request& req) const;
  // `t` on the host, counting the bytes when it comes from a device.
  at::Tensor to_host(const at::Tensor& t);
  void abort_now(const std::string& id);

  EngineConfig config_;
  std::unique_ptr<LocalTpFollowers> local_tp_;  // the follower threads; outlives runner_ (first)
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<StopChecker> stop_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<LoraRegistry> loras_;
  std::unique_ptr<WeightBuffers> weight_buffers_;
  at::Tensor weight_staging_;  // tensor-parallel: one bucket, reused (attach_weight_layout)
  std::vector<std::vector<at::Tensor>> lane_buckets_;  // by rank (attach_weight_lanes)
  std::vector<int32_t> eos_ids_;
  int64_t max_model_len_ = 0;
  int64_t weight_version_ = 0;
  int64_t next_arrival_ = 0;
  bool tensor_sampler_ = false;         // EngineConfig::sampler resolved
  bool finished_outputs_only_ = false;  // inside generate(): step() returns finished requests only
  int64_t step_d2h_bytes_ = 0;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  EngineStats stats_;
  LogitsObserver observer_;
  StepObserver step_observer_;
  StepRecord record_;  // the step in progress
  std::unique_ptr<Inbox> inbox_;
};

}  // namespace crl::engine

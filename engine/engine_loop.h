// EngineLoop: one engine thread that owns an LlmEngine and steps it for many submitters.
//
// Submitters (HTTP handler threads, the RL loop's rollout producer) call submit(), which
// queues the requests in the engine's thread-safe inbox and returns a RequestChannel; the engine
// thread loops step() and publishes every output into the channel of its request. Nothing but
// the engine thread touches the engine after start(), except its const, thread-safe parts
// (tokenizer, config, validate_request) through engine().
//
// Work between steps: post(fn) runs fn(engine) on the engine thread before the next step (the
// future says when it is done), and set_between_steps(fn) installs a hook called before every step.
//
// Weight updates (docs/design.md §3): the loop owns them. set_weight_source() hands it a
// sync::WeightSource; between two steps the engine thread polls it, receives the next version into
// the engine's own weight buckets, sets the version and applies the in-flight policy, in one place.
// weight_version() is the one reading of the engine's version off the engine thread.
//
// Pause: pause() closes admission (requests submitted meanwhile are held, not refused) and, in
// kAbort mode, aborts every request in flight; it returns once the engine has nothing in flight.
// resume() admits the held requests. submit() is the admission point: it and pause() take the
// same mutex, so a request whose submit() returned before pause() is in flight and kAbort aborts
// it even if the engine thread has not yet taken it from the engine's inbox (step() applies the
// queued adds before the queued aborts); one submitted after pause() is held. As in vLLM, an HTTP
// request still being parsed or tokenized when /pause arrives is submitted after it, so held
// until /resume; a streaming response's headers are sent only after submit() returned.
//
// Thread safety: every public method may be called from any thread, except that the functions
// given to post()/set_between_steps() run on the engine thread and must not call pause().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "engine/llm_engine.h"
#include "sync/weight_source.h"

namespace crl::engine {

// State of the engine, published by the engine thread after each step.
struct EngineGauges {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;  // in the scheduler's queue, plus held while paused
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;  // blocks with a reference (cached-but-free blocks are free)
  int64_t weight_version = 0;
  int64_t num_preemptions = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t steps = 0;
  // LoRA RL: policy updates that had to load into a slot a running request still used
  // (LoraRegistry::slot_reuses; more policy versions, --max-staleness + 1, avoid them).
  int64_t lora_slot_reuses = 0;
  // The colocated hand-over (LlmEngine::release_kv_cache): the pool is released now; seconds spent
  // taking it back (LlmEngine::restore_kv_cache, at the first work after a release), summed.
  bool kv_released = false;
  double kv_restore_seconds = 0;
  bool paused = false;
  bool loaded = false;
};

// Per-request latency events of the engine thread (the API server's Prometheus metrics implement
// it). Called on the engine thread with the loop's lock held: implementations must be quick and
// must not call back into the loop.
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  // The first generated token arrived `seconds` after submission.
  virtual void on_first_token(double seconds) = 0;
  // A step produced tokens for a request that already had some, `seconds` after its last ones.
  virtual void on_inter_token(double seconds) = 0;
  // A request finished: its prompt and generated tokens, why (stop, length, abort, error) and its
  // end-to-end latency.
  virtual void on_finished(int64_t prompt_tokens, int64_t generation_tokens,
                           const std::string& reason, double e2e_seconds) = 0;
};

// The outputs of the engine requests of one submission (index i = the i-th request submitted),
// filled by the engine thread. Each slot holds the latest cumulative output of its request.
class RequestChannel {
 public:
  explicit RequestChannel(std::vector<std::string> ids);
  RequestChannel(const RequestChannel&) = delete;
  RequestChannel& operator=(const RequestChannel&) = delete;

  struct Snapshot {
    std::vector<std::optional<RequestOutput>> outputs;  // nullopt: nothing yet
    uint64_t version = 0;                               // increases with every publish
    bool all_finished = false;
  };
  // Waits until something newer than `seen` was published or `timeout` passed; returns the
  // latest state (version == seen when nothing new came).
  Snapshot wait(uint64_t seen, std::chrono::milliseconds timeout);

  const std::vector<std::string>& ids() const { return ids_; }

  // Engine side: stores the latest output of request `index` and wakes the reader.
  void publish(size_t index, RequestOutput out);

 private:
  const std::vector<std::string> ids_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<RequestOutput>> outputs_;  // guarded by mu_
  uint64_t version_ = 0;                               // guarded by mu_
  size_t num_finished_ = 0;                            // guarded by mu_
};

enum class PauseMode { kAbort, kWait };

class EngineLoop {
 public:
  // Builds the engine from `config` on the engine thread (its thread settings apply there) and
  // then steps it. ready() turns true once it is built; load_error() says why it failed.
  explicit EngineLoop(EngineConfig config);
  // Steps an engine built elsewhere; from start() on only the engine thread touches it.
  explicit EngineLoop(std::unique_ptr<LlmEngine> engine);
  ~EngineLoop();  // stop()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void start();
  // Fails every request still in flight or held ("the engine stopped"), stops and joins the
  // thread. The futures of tasks posted but not run throw std::future_error (broken promise).
  void stop();

  // The engine's configuration (model directory, limits); fixed at construction.
  const EngineConfig& config() const { return config_; }
  bool ready() const;
  // Blocks until the engine is built; throws std::runtime_error with the load error.
  void wait_ready() const;
  std::string load_error() const;

  // The engine, for its thread-safe const parts only (tokenizer, config, validate_request,
  // encode_prompt). REQUIRES: ready().
  const LlmEngine& engine() const { return *engine_; }

  // Queues `requests` (all or none) and returns the channel their outputs go to. Request ids
  // must be unique and non-empty. Throws std::invalid_argument as LlmEngine::add_request does,
  // std::runtime_error when the engine is not ready or stopping.
  std::shared_ptr<RequestChannel> submit(std::vector<GenerateRequest> requests);
  // Aborts requests in any state (held ones included); unknown ids are ignored.
  void abort(const std::vector<std::string>& ids);

  // Runs fn(engine) on the engine thread before the next step. The future holds fn's exception.
  std::future<void> post(std::function<void(LlmEngine&)> fn);
  // Installs a hook called on the engine thread before every step (empty function = none).
  void set_between_steps(std::function<void(LlmEngine&)> fn);

  // Closes admission; kAbort also aborts every request in flight. Returns when nothing is in
  // flight, or false when `timeout` passed first (admission stays closed either way).
  bool pause(PauseMode mode, std::chrono::milliseconds timeout = std::chrono::hours(24));
  void resume();
  bool paused() const;

  // Installs the source of weight updates (nullptr: none, the default). From then on the engine
  // thread polls source->ready(weight_version() + 1) between two steps (when idle, every 0.1-2 ms)
  // and, once true, receives that version into the engine's weight buckets, sets it as the
  // engine's version and treats the sequences in flight by `policy`. REQUIRES: the engine's
  // weights live in sync buckets (LlmEngine::attach_weight_buffers, before start()). A failed
  // receive stops the updates (the weights are then undefined): weight_update_error() says why.
  void set_weight_source(std::shared_ptr<sync::WeightSource> source,
                         InflightPolicy policy = InflightPolicy::kKeep);
  // The engine's weight version (the checkpoint's on resume, then each version received).
  int64_t weight_version() const { return weight_version_.load(std::memory_order_acquire); }
  // Blocks until weight_version() >= version (true) or the deadline passed (false). Throws
  // std::runtime_error with weight_update_error() when an update failed.
  bool wait_weight_version(int64_t version, std::chrono::steady_clock::time_point deadline) const;
  // Why the last weight update failed ("" when none did).
  std::string weight_update_error() const;
  // Seconds the engine spent receiving weight updates (its pause for them), summed since start().
  double weight_update_seconds() const;

  EngineGauges gauges() const;
  // Installs the observer of request latencies (nullptr: none). Any thread.
  void set_request_observer(std::shared_ptr<RequestObserver> observer);

 private:
  struct Route {
    std::shared_ptr<RequestChannel> channel;
    size_t index = 0;
    std::chrono::steady_clock::time_point arrival;
    std::chrono::steady_clock::time_point last_token;
    int64_t tokens_seen = 0;
    bool admitted = false;  // in the engine (not held)
  };

  void run();
  void load();
  // Engine thread: routes outputs to their channels and records latency metrics.
  void deliver(std::vector<RequestOutput>& outputs);
  void publish_gauges();
  // Engine thread: receives the next weight version when `source` has it; true when one landed.
  bool take_weight_update(sync::WeightSource& source, InflightPolicy policy);
  // Publishes a finished, aborted output for a request that never reached the engine.
  void fail_unadmitted(const GenerateRequest& request, const std::string& error);

  EngineConfig config_;
  std::unique_ptr<LlmEngine> engine_;
  std::thread thread_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // engine thread wake-up, readiness, pause drained
  bool loaded_ = false;                 // guarded by mu_
  std::string load_error_;              // guarded by mu_
  bool started_ = false;                // guarded by mu_
  bool stopping_ = false;               // guarded by mu_
  bool paused_ = false;                 // guarded by mu_
  int64_t admitted_ = 0;                // routes in the engine; guarded by mu_
  std::unordered_map<std::string, Route> routes_;           // guarded by mu_
  std::deque<GenerateRequest> held_;                        // guarded by mu_
  std::deque<std::packaged_task<void(LlmEngine&)>> tasks_;  // guarded by mu_
  std::function<void(LlmEngine&)> between_steps_;           // guarded by mu_
  EngineGauges gauges_;                                     // guarded by mu_
  std::shared_ptr<RequestObserver> observer_;               // guarded by mu_
  bool work_pending_ = false;  // a submit/abort since the engine thread last looked; guarded by mu_
  std::shared_ptr<sync::WeightSource> weight_source_;     // guarded by mu_
  InflightPolicy weight_policy_ = InflightPolicy::kKeep;  // guarded by mu_
  std::string weight_error_;                              // guarded by mu_
  double weight_update_s_ = 0;                            // guarded by mu_
  std::atomic<int64_t> weight_version_{0};                // written by the engine thread under mu_
};

}  // namespace crl::engine

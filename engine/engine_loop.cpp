#include "engine/engine_loop.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <stdexcept>
#include <unordered_set>

namespace crl::engine {

namespace {

using Clock = std::chrono::steady_clock;

// While idle with a weight source installed, the engine thread polls it this often (backing off).
constexpr std::chrono::microseconds kMinWeightPoll{100};
constexpr std::chrono::microseconds kMaxWeightPoll{2000};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t generated_tokens(const RequestOutput& out) {
  int64_t n = 0;
  for (const auto& c : out.outputs) n += static_cast<int64_t>(c.token_ids.size());
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RequestChannel

RequestChannel::RequestChannel(std::vector<std::string> ids)
    : ids_(std::move(ids)), outputs_(ids_.size()) {}

RequestChannel::Snapshot RequestChannel::wait(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return version_ != seen; });
  Snapshot s;
  s.outputs = outputs_;
  s.version = version_;
  s.all_finished = num_finished_ == outputs_.size();
  return s;
}

void RequestChannel::publish(size_t index, RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= outputs_.size()) return;
    auto& slot = outputs_[index];
    if (slot && slot->finished) return;  // a finished request never changes again
    if (out.finished) num_finished_++;
    slot = std::move(out);
    version_++;
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// EngineLoop

EngineLoop::EngineLoop(EngineConfig config) : config_(std::move(config)) {}

EngineLoop::EngineLoop(std::unique_ptr<LlmEngine> engine)
    : config_(engine->config()), engine_(std::move(engine)) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::load() {
  std::string error;
  try {
    if (!engine_) {
      engine_ = std::make_unique<LlmEngine>(config_);  // sets this thread's thread count
    } else if (config_.num_threads > 0) {
      at::set_num_threads(config_.num_threads);  // built on another thread: apply it here too
    }
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "engine failed to load";
  }
  if (error.empty()) publish_gauges();  // so the pool size shows as soon as it is ready
  std::lock_guard<std::mutex> lock(mu_);
  if (error.empty()) {
    loaded_ = true;
  } else {
    load_error_ = error;
  }
  cv_.notify_all();
}

bool EngineLoop::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_;
}

void EngineLoop::wait_ready() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return loaded_ || !load_error_.empty() || stopping_; });
  if (!load_error_.empty()) throw std::runtime_error(load_error_);
  if (!loaded_) throw std::runtime_error("engine loop stopped before the engine was loaded");
}

std::string EngineLoop::load_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_error_;
}

void EngineLoop::run() {
  load();
  if (!ready()) return;
  bool busy = false;  // the engine has unfinished work
  auto poll = kMinWeightPoll;
  while (true) {
    std::deque<std::packaged_task<void(LlmEngine&)>> tasks;
    std::function<void(LlmEngine&)> between;
    std::shared_ptr<sync::WeightSource> source;
    InflightPolicy policy = InflightPolicy::kKeep;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto wake = [&] { return stopping_ || busy || work_pending_ || !tasks_.empty(); };
      if (weight_source_ && weight_error_.empty()) {
        if (!cv_.wait_for(lock, poll, wake)) poll = std::min(poll * 2, kMaxWeightPoll);
      } else {
        cv_.wait(lock, wake);
      }
      if (stopping_) break;
      tasks.swap(tasks_);
      between = between_steps_;
      work_pending_ = false;
      if (weight_error_.empty()) source = weight_source_;
      policy = weight_policy_;
    }
    for (auto& task : tasks) task(*engine_);  // a packaged_task keeps fn's exception
    if (between) {
      try {
        between(*engine_);
      } catch (const std::exception& e) {
        spdlog::error("engine loop: between-steps hook failed: {}", e.what());
      }
    }
    if (source && take_weight_update(*source, policy)) poll = kMinWeightPoll;
    if (engine_->has_unfinished()) {
      try {
        auto outputs = engine_->step();
        deliver(outputs);
      } catch (const std::exception& e) {
        // step() already fails only the batch on a forward error; anything else is a bug: fail
        // every request in flight rather than leave its client waiting.
        spdlog::error("engine loop: step failed: {}", e.what());
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [id, route] : routes_) {
          if (route.admitted) engine_->abort(id);
        }
      }
    }
    busy = engine_->has_unfinished();
    publish_gauges();
  }
}

void EngineLoop::deliver(std::vector<RequestOutput>& outputs) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& out : outputs) {
    auto it = routes_.find(out.request_id);
    if (it == routes_.end()) continue;  // not submitted through this loop
    Route& route = it->second;
    const int64_t tokens = generated_tokens(out);
    if (tokens > route.tokens_seen) {
      if (route.tokens_seen == 0) {
        if (observer_) observer_->on_first_token(seconds_between(route.arrival, now));
      } else {
        if (observer_) observer_->on_inter_token(seconds_between(route.last_token, now));
      }
      route.last_token = now;
      route.tokens_seen = tokens;
    }
    auto channel = route.channel;
    const size_t index = route.index;
    if (out.finished) {
      std::string reason = "abort";
      if (!out.error.empty()) {
        reason = "error";
      } else if (!out.outputs.empty()) {
        reason = finish_reason_name(out.outputs[0].finish_reason);
        for (const auto& c : out.outputs) {
          if (c.finish_reason == FinishReason::kAbort) reason = "abort";
        }
      }
      if (observer_)
        observer_->on_finished(static_cast<int64_t>(out.prompt_token_ids.size()), tokens, reason,
                               seconds_between(route.arrival, now));
      routes_.erase(it);
      if (--admitted_ == 0) cv_.notify_all();  // pause() may be waiting for this
    }
    channel->publish(index, std::move(out));
  }
}

void EngineLoop::publish_gauges() {
  EngineGauges g;
  const auto& sched = engine_->scheduler();
  std::unordered_set<const Request*> running;
  for (const Sequence* s : sched.running()) running.insert(s->request);
  g.running_requests = static_cast<int64_t>(running.size());
  g.waiting_requests = static_cast<int64_t>(sched.num_waiting());
  g.kv_blocks_total = sched.allocator().num_blocks();
  g.kv_blocks_used = sched.allocator().num_used_blocks();
  g.weight_version = engine_->weight_version();
  g.num_preemptions = engine_->stats().preemptions;
  g.prefix_cache_hit_tokens = engine_->stats().prefix_hit_tokens;
  g.steps = engine_->stats().steps;
  g.lora_slot_reuses = engine_->loras().slot_reuses();
  g.kv_released = engine_->kv_cache_released();
  g.kv_restore_seconds = engine_->stats().kv_restore_seconds;
  g.loaded = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gauges_ = g;
    weight_version_.store(g.weight_version, std::memory_order_release);
  }
  cv_.notify_all();  // wait_weight_version() may be waiting for this version
}

bool EngineLoop::take_weight_update(sync::WeightSource& source, InflightPolicy policy) {
  const int64_t next = engine_->weight_version() + 1;
  std::string error;
  double seconds = 0;
  try {
    if (!source.ready(next)) return false;
    const auto t0 = Clock::now();
    // Into the model's buckets, the LoRA policy's, or staged onto a tensor-parallel group.
    engine_->receive_weight_update(source, next, policy);
    seconds = seconds_between(t0, Clock::now());
  } catch (const std::exception& e) {
    error = fmt::format("weight update to version {} failed: {}", next, e.what());
    spdlog::error("engine loop: {}", error);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error.empty()) {
      weight_update_s_ += seconds;
    } else {
      weight_error_ = error;
    }
  }
  publish_gauges();  // the new version shows, and its waiters wake, before the next step
  return error.empty();
}

void EngineLoop::set_weight_source(std::shared_ptr<sync::WeightSource> source,
                                   InflightPolicy policy) {
  std::lock_guard<std::mutex> lock(mu_);
  weight_source_ = std::move(source);
  weight_policy_ = policy;
  cv_.notify_all();
}

bool EngineLoop::wait_weight_version(int64_t version, Clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  const bool reached = cv_.wait_until(lock, deadline, [&] {
    return weight_version_.load(std::memory_order_acquire) >= version || !weight_error_.empty() ||
           stopping_;
  });
  if (!weight_error_.empty()) throw std::runtime_error(weight_error_);
  return reached && weight_version_.load(std::memory_order_acquire) >= version;
}

std::string EngineLoop::weight_update_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return weight_error_;
}

double EngineLoop::weight_update_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return weight_update_s_;
}

void EngineLoop::set_request_observer(std::shared_ptr<RequestObserver> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

EngineGauges EngineLoop::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineGauges g = gauges_;
  g.waiting_requests += static_cast<int64_t>(held_.size());
  g.paused = paused_;
  g.loaded = loaded_;
  return g;
}

void EngineLoop::fail_unadmitted(const GenerateRequest& request, const std::string& error) {
  auto it = routes_.find(request.request_id);
  if (it == routes_.end()) return;
  RequestOutput out;
  out.request_id = request.request_id;
  out.prompt_token_ids = request.prompt_token_ids;
  out.finished = true;
  out.error = error;
  out.weight_version = out.first_weight_version = gauges_.weight_version;
  for (int32_t k = 0; k < request.params.n; ++k) {
    CompletionOutput c;
    c.index = k;
    c.finish_reason = FinishReason::kAbort;
    out.outputs.push_back(std::move(c));
  }
  if (observer_)
    observer_->on_finished(static_cast<int64_t>(request.prompt_token_ids.size()), 0,
                           error.empty() ? "abort" : "error",
                           seconds_between(it->second.arrival, Clock::now()));
  auto channel = it->second.channel;
  const size_t index = it->second.index;
  routes_.erase(it);
  channel->publish(index, std::move(out));
}

std::shared_ptr<RequestChannel> EngineLoop::submit(std::vector<GenerateRequest> requests) {
  std::vector<std::string> ids;
  for (const auto& r : requests) {
    if (r.request_id.empty()) throw std::invalid_argument("EngineLoop::submit: empty request id");
    ids.push_back(r.request_id);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) throw std::runtime_error("the engine is stopping");
  if (!loaded_) {
    throw std::runtime_error(load_error_.empty() ? "the engine is still loading"
                                                 : "the engine failed to load: " + load_error_);
  }
  std::unordered_set<std::string> unique;
  for (const auto& id : ids) {
    if (routes_.count(id) || !unique.insert(id).second) {
      throw std::invalid_argument("request id '" + id + "' is already in use");
    }
  }
  auto channel = std::make_shared<RequestChannel>(ids);
  if (!paused_) {
    size_t added = 0;
    try {
      for (; added < requests.size(); ++added) engine_->add_request(requests[added]);
    } catch (...) {
      for (size_t i = 0; i < added; ++i) engine_->abort(ids[i]);  // all or none
      throw;
    }
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < ids.size(); ++i) {
    Route r;
    r.channel = channel;
    r.index = i;
    r.arrival = r.last_token = now;
    r.admitted = !paused_;
    routes_.emplace(ids[i], std::move(r));
  }
  if (paused_) {
    for (auto& r : requests) held_.push_back(std::move(r));
  } else {
    admitted_ += static_cast<int64_t>(ids.size());
  }
  work_pending_ = true;
  cv_.notify_all();
  return channel;
}

void EngineLoop::abort(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    auto it = routes_.find(id);
    if (it == routes_.end()) continue;
    if (it->second.admitted) {
      if (engine_) engine_->abort(id);
      continue;
    }
    for (auto h = held_.begin(); h != held_.end(); ++h) {
      if (h->request_id != id) continue;
      GenerateRequest request = std::move(*h);
      held_.erase(h);
      fail_unadmitted(request, "");
      break;
    }
  }
  work_pending_ = true;
  cv_.notify_all();
}

std::future<void> EngineLoop::post(std::function<void(LlmEngine&)> fn) {
  // Gauges are published before the future is ready: a new weight version shows at once.
  std::packaged_task<void(LlmEngine&)> task([this, fn = std::move(fn)](LlmEngine& e) {
    fn(e);
    publish_gauges();
  });
  auto future = task.get_future();
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    std::promise<void> failed;
    failed.set_exception(std::make_exception_ptr(std::runtime_error("the engine loop is stopped")));
    return failed.get_future();
  }
  tasks_.push_back(std::move(task));
  cv_.notify_all();
  return future;
}

void EngineLoop::set_between_steps(std::function<void(LlmEngine&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  between_steps_ = std::move(fn);
}

bool EngineLoop::pause(PauseMode mode, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  paused_ = true;
  if (mode == PauseMode::kAbort && engine_) {
    for (auto& [id, route] : routes_) {
      if (route.admitted) engine_->abort(id);
    }
    work_pending_ = true;
  }
  cv_.notify_all();
  return cv_.wait_for(lock, timeout, [&] { return admitted_ == 0 || stopping_; });
}

void EngineLoop::resume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!paused_) return;
  paused_ = false;
  std::deque<GenerateRequest> held;
  held.swap(held_);
  for (auto& r : held) {
    auto it = routes_.find(r.request_id);
    if (it == routes_.end()) continue;
    try {
      engine_->add_request(r);
      it->second.admitted = true;
      admitted_++;
    } catch (const std::exception& e) {
      fail_unadmitted(r, e.what());
    }
  }
  work_pending_ = true;
  cv_.notify_all();
}

bool EngineLoop::paused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return paused_;
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // Nobody steps the engine any more: end every open request so no reader waits forever.
  std::vector<GenerateRequest> open;
  for (auto& r : held_) open.push_back(std::move(r));
  held_.clear();
  for (auto& [id, route] : routes_) {
    if (!route.admitted) continue;
    GenerateRequest r;
    r.request_id = id;
    r.params.n = 1;
    open.push_back(std::move(r));
  }
  for (auto& r : open) fail_unadmitted(r, "the engine stopped");
  admitted_ = 0;
  tasks_.clear();  // an unrun packaged_task's future throws std::future_error (broken promise)
  cv_.notify_all();
}

}  // namespace crl::engine

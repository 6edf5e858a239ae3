#include "trainer/process_env.h"

#include <algorithm>
#include <future>
#include <stdexcept>

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

EnvReply failed(const std::string& error) {
  EnvReply r;
  r.done = true;
  r.error = error;
  return r;
}

// Checks a reply line's fields (EnvReply from a parsed JSON object); "" when it is well formed.
std::string read_reply(const ojson& j, const std::string& episode_id, bool is_reset, EnvReply* r) {
  if (!j.contains("episode_id") || !j["episode_id"].is_string()) return "no \"episode_id\" string";
  if (j["episode_id"] != episode_id) {
    return "reply names episode '" + j["episode_id"].get<std::string>() + "', the request '" +
           episode_id + "'";
  }
  r->done = false;
  if (j.contains("done")) {
    if (!j["done"].is_boolean()) return "\"done\" must be true or false";
    r->done = j["done"].get<bool>();
  }
  if (is_reset && r->done) return "a reset cannot end the episode";
  if (j.contains("messages")) {
    if (!j["messages"].is_array()) return "\"messages\" must be a list";
    for (const auto& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return "every message must be an object with a string \"role\"";
      }
    }
    r->messages = j["messages"];
  }
  if (!r->done && r->messages.empty()) {
    return is_reset ? "a reset must give the opening \"messages\""
                    : "a step that does not end the episode must give \"messages\"";
  }
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return "\"tools\" must be a list";
    r->tools = j["tools"];
  }
  if (r->done) {
    if (!j.contains("reward") || !j["reward"].is_number())
      return "\"done\" without a numeric \"reward\"";
    r->reward = j["reward"].get<double>();
    r->correct = r->reward > 0;
    if (j.contains("correct")) {
      if (!j["correct"].is_boolean()) return "\"correct\" must be true or false";
      r->correct = j["correct"].get<bool>();
    }
  }
  return "";
}

}  // namespace

ProcessEnv::ProcessEnv(std::string command, const EnvOptions& options)
    : command_(std::move(command)),
      io_(command_, options.timeout, options.pass_env, {"env", "environment", "episode_id"}) {
  thread_ = std::thread([this] { worker(); });
  // Start the process now (on the worker: a process dies with the thread that started it,
  // PR_SET_PDEATHSIG). A command sh cannot run exits 127: the first request says so (env_died).
  std::promise<void> started;
  auto done = started.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back([this, &started] {
      try {
        io_.start();
        started.set_value();
      } catch (...) {
        started.set_exception(std::current_exception());
      }
    });
  }
  cv_.notify_all();
  try {
    done.get();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    throw;
  }
}

ProcessEnv::~ProcessEnv() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t ProcessEnv::starts() const { return io_.starts(); }

void ProcessEnv::worker() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) break;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
  io_.finish();  // EOF on its stdin: a well-behaved environment exits
}

EnvReply ProcessEnv::exchange(const ojson& request, bool expect_reply, bool is_reset) {
  auto task =
      std::make_shared<std::packaged_task<EnvReply()>>([this, request, expect_reply, is_reset] {
        return exchange_now(request, expect_reply, is_reset);
      });
  auto reply = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return failed("env_died: the environment is shutting down");
    jobs_.push_back([task] { (*task)(); });
  }
  cv_.notify_all();
  return reply.get();
}

EnvReply ProcessEnv::exchange_now(const ojson& request, bool expect_reply, bool is_reset) {
  const std::string episode_id = request["episode_id"].get<std::string>();
  const std::string op = request["op"].get<std::string>();
  const std::string what = op + " of episode '" + episode_id + "'";
  const bool demo = op == "demonstration";  // no episode: nothing to check or remember
  if (!demo) {
    if (auto gone = check_episode(op, episode_id, expect_reply)) return *gone;
  }
  // One deadline for the request and its reply (JsonLinesProcess::exchange).
  std::string reply_line;
  ojson j;
  const std::string err = io_.exchange(request, expect_reply, what, &j, &reply_line);
  if (!err.empty()) {
    born_.erase(episode_id);  // any failure ends the episode
    return failed(err);
  }
  if (!expect_reply) return {};
  if (demo) return read_demonstration(j, what, episode_id, reply_line);
  EnvReply r;
  const std::string bad = read_reply(j, episode_id, is_reset, &r);
  if (!bad.empty()) {
    born_.erase(episode_id);
    return failed("env_malformed: the reply to the " + what + ": " + bad + ": " +
                  program_output_excerpt(reply_line));
  }
  if (is_reset) {
    born_[episode_id] = io_.starts();
  } else if (r.done) {
    born_.erase(episode_id);
  }
  return r;
}

std::optional<EnvReply> ProcessEnv::check_episode(const std::string& op,
                                                  const std::string& episode_id,
                                                  bool expect_reply) {
  if (op == "reset") return std::nullopt;
  auto it = born_.find(episode_id);
  const int64_t current = io_.running() ? io_.starts() : -1;
  if (it == born_.end() || it->second != current) {
    if (!expect_reply) return EnvReply{};  // nothing to close in a process that never saw it
    if (it != born_.end()) born_.erase(it);
    return failed("env_died: the environment process (" + command_ + ") that began episode '" +
                  episode_id + "' is gone");
  }
  if (op == "close") born_.erase(it);
  return std::nullopt;
}

EnvReply ProcessEnv::read_demonstration(const ojson& j, const std::string& what,
                                        const std::string& episode_id, const std::string& line) {
  if (!j.contains("episode_id") || j["episode_id"] != episode_id || !j.contains("demonstration")) {
    return failed(
        "env_malformed: the reply to the " + what + " must name the request's \"episode_id\" " +
        "and hold \"demonstration\" (an object, or null): " + program_output_excerpt(line));
  }
  const ojson& d = j["demonstration"];
  if (!d.is_null() && (!d.is_object() || !d.contains("messages") || !d["messages"].is_array())) {
    return failed("env_malformed: the reply to the " + what +
                  ": \"demonstration\" must be null or " +
                  "{\"messages\": [...], \"tools\": [...]}: " + program_output_excerpt(line));
  }
  EnvReply r;
  r.demonstration = d;
  return r;
}

EnvReply ProcessEnv::reset(const std::string& episode_id, EnvSplit split, int64_t index,
                           const ojson& task) {
  ojson q = {{"op", "reset"},
             {"episode_id", episode_id},
             {"split", env_split_name(split)},
             {"index", index}};
  if (!task.is_null()) q["task"] = task;
  return exchange(q, true, true);
}

EnvReply ProcessEnv::step(const std::string& episode_id, const ojson& assistant) {
  ojson q = {{"op", "step"}, {"episode_id", episode_id}, {"message", assistant}};
  return exchange(q, true, false);
}

ojson ProcessEnv::demonstration(EnvSplit split, int64_t index, const ojson& task) {
  const std::string id = std::string("demo-") + env_split_name(split) + "-" + std::to_string(index);
  ojson q = {{"op", "demonstration"},
             {"episode_id", id},
             {"split", env_split_name(split)},
             {"index", index}};
  if (!task.is_null()) q["task"] = task;
  EnvReply r = exchange(q, true, false);
  if (!r.error.empty())
    throw std::runtime_error("--env " + command_ +
                             ": no demonstration for the warm-up: " + r.error);
  if (!r.demonstration.is_null() && !r.demonstration.contains("tools"))
    r.demonstration["tools"] = nullptr;
  return r.demonstration;
}

void ProcessEnv::close(const std::string& episode_id) {
  // Queued, not waited for: the caller (the episode runner's thread) never waits behind a slow
  // request of another episode.
  ojson q = {{"op", "close"}, {"episode_id", episode_id}};
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  jobs_.push_back([this, q] { exchange_now(q, false, false); });
  cv_.notify_all();
}

ProcessEnvPool::ProcessEnvPool(const std::string& command, const EnvOptions& options) {
  if (options.processes < 1) throw std::invalid_argument("--env-procs must be >= 1");
  for (int32_t i = 0; i < options.processes; ++i)
    envs_.push_back(std::make_unique<ProcessEnv>(command, options));
  open_.assign(envs_.size(), 0);
}

int64_t ProcessEnvPool::owner(const std::string& episode_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owner_.find(episode_id);
  return it == owner_.end() ? -1 : static_cast<int64_t>(it->second);
}

EnvReply ProcessEnvPool::reset(const std::string& episode_id, EnvSplit split, int64_t index,
                               const ojson& task) {
  size_t p = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = owner_.find(episode_id); it != owner_.end()) {  // a reset again: same process
      p = it->second;
    } else {
      p = static_cast<size_t>(std::min_element(open_.begin(), open_.end()) - open_.begin());
      owner_[episode_id] = p;
      ++open_[p];
    }
  }
  EnvReply r = envs_[p]->reset(episode_id, split, index, task);
  if (!r.error.empty() || r.done) forget(episode_id);
  return r;
}

std::optional<size_t> ProcessEnvPool::forget(const std::string& episode_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owner_.find(episode_id);
  if (it == owner_.end()) return std::nullopt;
  const size_t p = it->second;
  owner_.erase(it);
  --open_[p];
  return p;
}

EnvReply ProcessEnvPool::step(const std::string& episode_id, const ojson& assistant) {
  const int64_t p = owner(episode_id);
  if (p < 0) {
    EnvReply r;
    r.error = "env_malformed: a step of episode '" + episode_id +
              "', which is not open (never reset, or ended)";
    return r;
  }
  EnvReply r = envs_[static_cast<size_t>(p)]->step(episode_id, assistant);
  if (r.done || !r.error.empty()) forget(episode_id);  // over on its process: here too
  return r;
}

void ProcessEnvPool::close(const std::string& episode_id) {
  if (const std::optional<size_t> p = forget(episode_id)) envs_[*p]->close(episode_id);
}

ojson ProcessEnvPool::demonstration(EnvSplit split, int64_t index, const ojson& task) {
  size_t p = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p = next_demo_++ % envs_.size();
  }
  return envs_[p]->demonstration(split, index, task);
}

int64_t ProcessEnvPool::starts() const {
  int64_t n = 0;
  for (const auto& e : envs_) n += e->starts();
  return n;
}

}  // namespace crl::trainer

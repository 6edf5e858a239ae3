#include "trainer/process_env.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <stdexcept>

#include "common/json_depth.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLineBytes = size_t{64} << 20;  // one reply line

// At most 120 bytes of `s`, cut at a UTF-8 character boundary (errors land in JSON metrics).
// The first ~120 bytes of what an environment wrote, for a log line or an error: control bytes
// (a raw newline or escape sequence would forge or garble log lines) written as \xNN.
std::string excerpt(const std::string& s) {
  size_t cut = s.size();
  if (s.size() > 120) {
    cut = 117;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  }
  std::string out;
  out.reserve(cut + 8);
  static const char* kHex = "0123456789abcdef";
  for (size_t i = 0; i < cut; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return cut < s.size() ? out + "..." : out;
}

EnvReply failed(const std::string& error) {
  EnvReply r;
  r.done = true;
  r.error = error;
  return r;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
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

// The environment an environment process starts with: the variables a program needs to run
// (ProcessEnv's contract) and the ones the user passes, from this process's own.
std::vector<std::string> clean_environment(const std::vector<std::string>& pass) {
  static const char* kKept[] = {"PATH",       "HOME",        "USER",         "LOGNAME",
                                "SHELL",      "LANG",        "LANGUAGE",     "LC_*",
                                "TZ",         "TMPDIR",      "TERM",         "PYTHONPATH",
                                "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH"};
  auto matches = [](const std::string& name, const std::string& pattern) {
    if (!pattern.empty() && pattern.back() == '*') {
      return name.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
    }
    return name == pattern;
  };
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool keep = std::any_of(std::begin(kKept), std::end(kKept),
                            [&](const char* k) { return matches(name, k); });
    keep = keep || std::any_of(pass.begin(), pass.end(),
                               [&](const std::string& p) { return matches(name, p); });
    if (keep) out.push_back(entry);
  }
  return out;
}

}  // namespace

ProcessEnv::ProcessEnv(std::string command, const EnvOptions& options)
    : command_(std::move(command)),
      timeout_(options.timeout),
      env_(clean_environment(options.pass_env)) {
  if (timeout_.count() <= 0) throw std::invalid_argument("the environment timeout must be > 0");
  thread_ = std::thread([this] { worker(); });
  // Start the process now (on the worker: a process dies with the thread that started it,
  // PR_SET_PDEATHSIG). A command sh cannot run exits 127: the first request says so (env_died).
  std::promise<void> started;
  auto done = started.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back([this, &started] {
      try {
        start_process();
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

int64_t ProcessEnv::starts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starts_;
}

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
  if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);  // EOF on its stdin: a well-behaved environment exits
  }
  stop_process();
}

void ProcessEnv::start_process() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw std::runtime_error(std::string("environment: socketpair: ") + std::strerror(errno));
  }
  // The exec's arguments and environment, made before the fork (the child only execs).
  std::vector<char*> envp;
  for (const std::string& e : env_) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw std::runtime_error(std::string("environment: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);  // its own group: stop_process() ends what the shell started too
    ::dup2(sv[1], 0);
    ::dup2(sv[1], 1);
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first
  ::close(sv[1]);
  fd_ = sv[0];
  pid_ = pid;
  buffer_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  ++starts_;
}

std::string ProcessEnv::stop_process() {
  std::string how = "not running";
  if (pid_ > 0) {
    int status = 0;
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    ::kill(-pid_, SIGKILL);  // the shell's group: a command it forked rather than exec'ed too
    if (got == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      how = "killed";
    } else if (got == pid_) {
      how = describe_status(status);
    }
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  pid_ = -1;
  buffer_.clear();
  return how;
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
  if (pid_ < 0) {
    try {
      start_process();
    } catch (const std::exception& e) {
      return failed(std::string("env_died: ") + e.what());
    }
  }
  drop_stray_output();
  // One deadline for the request and its reply: a process that stops reading its stdin (a full
  // pipe) times out as one that never answers does, instead of blocking the send for ever.
  const auto deadline = Clock::now() + timeout_;
  const std::string line =
      request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (auto err = send_line(line, deadline, what, episode_id)) return *err;
  if (!expect_reply) return {};
  std::string reply_line;
  ojson j;
  if (auto err = read_reply_object(deadline, what, episode_id, &reply_line, &j)) return *err;
  if (demo) return read_demonstration(j, what, episode_id, reply_line);
  EnvReply r;
  const std::string bad = read_reply(j, episode_id, is_reset, &r);
  if (!bad.empty()) {
    born_.erase(episode_id);
    return failed("env_malformed: the reply to the " + what + ": " + bad + ": " +
                  excerpt(reply_line));
  }
  if (is_reset) {
    std::lock_guard<std::mutex> lock(mu_);
    born_[episode_id] = starts_;
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
  int64_t current;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = pid_ > 0 ? starts_ : -1;
  }
  if (it == born_.end() || it->second != current) {
    if (!expect_reply) return EnvReply{};  // nothing to close in a process that never saw it
    if (it != born_.end()) born_.erase(it);
    return failed("env_died: the environment process (" + command_ + ") that began episode '" +
                  episode_id + "' is gone");
  }
  if (op == "close") born_.erase(it);
  return std::nullopt;
}

EnvReply ProcessEnv::died(const std::string& doing, const std::string& what,
                          const std::string& episode_id) {
  // Give a dying process a moment to be reaped, so the error says how it ended.
  for (int i = 0; i < 50; ++i) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != 0) {
      break;
    }
    ::usleep(2000);
  }
  const std::string how = stop_process();
  born_.erase(episode_id);
  return failed("env_died: the environment process (" + command_ + ") " + doing + " at the " +
                what + " (" + how + ")");
}

std::optional<EnvReply> ProcessEnv::send_line(const std::string& line, Clock::time_point deadline,
                                              const std::string& what,
                                              const std::string& episode_id) {
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n =
        ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        stop_process();  // the rest of the line must not reach a later request's reader
        born_.erase(episode_id);
        return failed("env_timeout: the environment (" + command_ + ") did not read the " + what +
                      " within " + std::to_string(timeout_.count()) + " ms (" +
                      std::to_string(sent) + " of " + std::to_string(line.size()) +
                      " bytes taken)");
      }
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 &&
          errno != EINTR) {
        return died("failed a poll", what, episode_id);
      }
      continue;
    }
    if (n <= 0) return died("stopped reading its stdin", what, episode_id);
    sent += static_cast<size_t>(n);
  }
  return std::nullopt;
}

std::optional<EnvReply> ProcessEnv::read_line(Clock::time_point deadline, const std::string& what,
                                              const std::string& episode_id, std::string* line) {
  size_t eol;
  size_t from = 0;  // bytes of buffer_ already searched: each byte is looked at once
  while ((eol = buffer_.find('\n', from)) == std::string::npos) {
    from = buffer_.size();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      stop_process();  // a late reply must not answer a later request
      born_.erase(episode_id);
      return failed("env_timeout: no reply from the environment (" + command_ + ") within " +
                    std::to_string(timeout_.count()) + " ms to the " + what);
    }
    if (buffer_.size() > kMaxLineBytes) {
      stop_process();
      born_.erase(episode_id);
      return failed("env_malformed: the reply to the " + what + " is a line of over " +
                    std::to_string(kMaxLineBytes >> 20) + " MiB: " + excerpt(buffer_));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return died("failed a poll", what, episode_id);
    if (ready <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return died("closed its stdout", what, episode_id);
    buffer_.append(buf, static_cast<size_t>(n));
  }
  *line = buffer_.substr(0, eol);
  buffer_.erase(0, eol + 1);
  return std::nullopt;
}

std::optional<EnvReply> ProcessEnv::read_reply_object(Clock::time_point deadline,
                                                      const std::string& what,
                                                      const std::string& episode_id,
                                                      std::string* line, ojson* j) {
  for (;;) {  // until a line that is meant as a reply (what is not is dropped: see below)
    if (auto err = read_line(deadline, what, episode_id, line)) return err;
    // A line that does not open a JSON object (a banner, a log line) or an object without an
    // "episode_id" (an answer to "close") is no reply: dropped, so it cannot take the place of
    // this reply and shift every later one. A line that opens an object is the reply, good or bad.
    const size_t b = line->find_first_not_of(" \t\r");
    if (b != std::string::npos && (*line)[b] == '{') {
      bool too_deep = false;
      *j = parse_untrusted_json<ojson>(*line, &too_deep);
      if (too_deep) {
        born_.erase(episode_id);
        return failed("env_malformed: the reply to the " + what +
                      " nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels: " + excerpt(*line));
      }
      if (j->is_discarded() || !j->is_object() || j->contains("episode_id")) break;
    }
    // The first few dropped lines in full, then a count now and then (a chatty process must not
    // fill the log).
    ++dropped_lines_;
    if (dropped_lines_ <= kLoggedDroppedLines) {
      spdlog::warn(
          "environment ({}): dropped a line that is not a reply (waiting for the {}'s): {}{}",
          command_, what, excerpt(*line),
          dropped_lines_ == kLoggedDroppedLines ? " (later ones are counted, not shown)" : "");
    } else if (dropped_lines_ % 10000 == 0) {
      spdlog::warn("environment ({}): {} lines dropped so far that were not replies", command_,
                   dropped_lines_);
    }
  }
  if (j->is_discarded() || !j->is_object()) {
    born_.erase(episode_id);  // over, as after any malformed reply
    return failed("env_malformed: the reply to the " + what +
                  " is not a JSON object: " + excerpt(*line));
  }
  return std::nullopt;
}

EnvReply ProcessEnv::read_demonstration(const ojson& j, const std::string& what,
                                        const std::string& episode_id, const std::string& line) {
  if (!j.contains("episode_id") || j["episode_id"] != episode_id || !j.contains("demonstration")) {
    return failed("env_malformed: the reply to the " + what +
                  " must name the request's \"episode_id\" " +
                  "and hold \"demonstration\" (an object, or null): " + excerpt(line));
  }
  const ojson& d = j["demonstration"];
  if (!d.is_null() && (!d.is_object() || !d.contains("messages") || !d["messages"].is_array())) {
    return failed("env_malformed: the reply to the " + what +
                  ": \"demonstration\" must be null or " +
                  "{\"messages\": [...], \"tools\": [...]}: " + excerpt(line));
  }
  EnvReply r;
  r.demonstration = d;
  return r;
}

void ProcessEnv::drop_stray_output() {
  // One request at a time, each reply read or timed out (the process then restarted): what the
  // process wrote before this request cannot answer it (a banner, a log line, a second reply, an
  // answer to "close"). What comes after the request is sorted by the reading loop.
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (buffer_.size() > kMaxLineBytes || ::poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) break;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;  // death shows at the send or the read that follows
    buffer_.append(buf, static_cast<size_t>(n));
  }
  if (buffer_.empty()) return;
  spdlog::warn("environment ({}): dropped {} bytes it wrote unasked: {}", command_, buffer_.size(),
               excerpt(buffer_));
  buffer_.clear();
}

EnvReply ProcessEnv::reset(const std::string& episode_id, EnvSplit split, int64_t index) {
  ojson q = {{"op", "reset"},
             {"episode_id", episode_id},
             {"split", env_split_name(split)},
             {"index", index}};
  return exchange(q, true, true);
}

EnvReply ProcessEnv::step(const std::string& episode_id, const ojson& assistant) {
  ojson q = {{"op", "step"}, {"episode_id", episode_id}, {"message", assistant}};
  return exchange(q, true, false);
}

ojson ProcessEnv::demonstration(EnvSplit split, int64_t index) {
  const std::string id = std::string("demo-") + env_split_name(split) + "-" + std::to_string(index);
  ojson q = {{"op", "demonstration"},
             {"episode_id", id},
             {"split", env_split_name(split)},
             {"index", index}};
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

EnvReply ProcessEnvPool::reset(const std::string& episode_id, EnvSplit split, int64_t index) {
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
  EnvReply r = envs_[p]->reset(episode_id, split, index);
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

ojson ProcessEnvPool::demonstration(EnvSplit split, int64_t index) {
  size_t p = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p = next_demo_++ % envs_.size();
  }
  return envs_[p]->demonstration(split, index);
}

int64_t ProcessEnvPool::starts() const {
  int64_t n = 0;
  for (const auto& e : envs_) n += e->starts();
  return n;
}

}  // namespace crl::trainer

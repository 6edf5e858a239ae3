// JsonLinesProcess: a program the job talks to in JSON lines over its stdin/stdout, one request
// line in and (optionally) one reply line out at a time: the transport under the external
// environments (process_env.h) and the reward programs (reward_program.h).
//
// The program runs as `/bin/sh -c COMMAND` in a process group of its own, stderr shared with the
// job's, with a clean environment: PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ,
// TMPDIR, TERM, PYTHONPATH, PYTHONHOME, VIRTUAL_ENV, CONDA_PREFIX, LD_LIBRARY_PATH and the names
// passed (`--env-pass`; NAME* for a prefix), nothing else: no CRL_* (the API key, the rendezvous
// store's address), no other secrets. It gets SIGKILL when the thread that started it ends
// (PR_SET_PDEATHSIG), and a command it forked reads EOF on its stdin.
//
// A reply is the first line after the request that opens a JSON object carrying the id key
// ("episode_id", "id"); other lines (a banner, a log line, an object without the key) are dropped
// and logged (the first few, then a count), so they cannot take a reply's place and shift every
// later one. What the program wrote before a request is dropped too. Failures come back as one
// string naming the kind before the colon, prefixed by the program's kind (Names::kind "env" ->
// "env_died: ..."):
//   <kind>_died       the process exited, closed its stdout or stopped reading its stdin;
//   <kind>_timeout    no reply line within the timeout (the process is killed: a late reply
//                     cannot answer a later request);
//   <kind>_malformed  a reply that is not a JSON object, nests too deep or is a line over 64 MiB.
// After a failure the process is gone or restarted by the next request.
//
// Thread safety: none; one thread at a time (the owner serializes its requests).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace crl::trainer {

class JsonLinesProcess {
 public:
  struct Names {
    std::string kind;    // error prefix: "env" gives env_died, env_timeout, env_malformed
    std::string noun;    // in messages: "environment", "reward program"
    std::string id_key;  // the reply's field that names its request: "episode_id", "id"
  };

  JsonLinesProcess(std::string command, std::chrono::milliseconds timeout,
                   const std::vector<std::string>& pass_env, Names names);
  ~JsonLinesProcess();
  JsonLinesProcess(const JsonLinesProcess&) = delete;
  JsonLinesProcess& operator=(const JsonLinesProcess&) = delete;

  // Starts the process. Throws std::runtime_error when it cannot (socketpair, fork); a command sh
  // cannot run exits 127, which the first request reports (<kind>_died).
  void start();
  bool running() const { return pid_ > 0; }
  // Processes started so far. Any thread.
  int64_t starts() const { return starts_.load(); }
  // EOF on the program's stdin (a well-behaved program exits), then stop().
  void finish();
  // Kills the process group (if any) and reaps it; returns how it ended ("exit status 3", ...).
  std::string stop();

  // Sends `request` (one line; started first when not running) and, with `expect_reply`, reads
  // the reply object into *reply (its line into *line, for errors). `what` names the request in
  // errors ("reset of episode 'e1'"). One deadline for both: a process that stops reading its
  // stdin times out as one that never answers. Returns the failure ("" when none).
  std::string exchange(const nlohmann::ordered_json& request, bool expect_reply,
                       const std::string& what, nlohmann::ordered_json* reply, std::string* line);

  const std::string& command() const { return command_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // "<kind>_<what>: " + text.
  std::string error(const char* what, const std::string& text) const;

 private:
  using Clock = std::chrono::steady_clock;
  // Each returns the failure that ends the exchange, if any.
  std::optional<std::string> send_line(const std::string& line, Clock::time_point deadline,
                                       const std::string& what);
  std::optional<std::string> read_line(Clock::time_point deadline, const std::string& what,
                                       std::string* line);
  std::optional<std::string> read_reply_object(Clock::time_point deadline, const std::string& what,
                                               std::string* line, nlohmann::ordered_json* j);
  // The process ended while `doing` something: <kind>_died saying how, after reaping it.
  std::string died(const std::string& doing, const std::string& what);
  void drop_stray_output();

  const std::string command_;
  const std::chrono::milliseconds timeout_;
  const std::vector<std::string> env_;  // the process's environment, "NAME=value"
  const Names names_;
  pid_t pid_ = -1;
  int fd_ = -1;         // our end of the socket pair (the child's stdin and stdout)
  std::string buffer_;  // bytes read past the last line
  // Lines dropped as no reply over the object's life: the first kLoggedDroppedLines are logged.
  int64_t dropped_lines_ = 0;
  static constexpr int64_t kLoggedDroppedLines = 5;
  std::atomic<int64_t> starts_{0};
};

// The first ~120 bytes of what a program wrote, for a log line or an error: control bytes (a raw
// newline or escape sequence would forge or garble log lines) written as \xNN.
std::string program_output_excerpt(const std::string& s);

}  // namespace crl::trainer

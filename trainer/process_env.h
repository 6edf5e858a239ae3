// ProcessEnv: an environment that is any program speaking JSON lines on stdin/stdout (issue 28),
// started by the job (`/bin/sh -c COMMAND`, stderr shared with the job's), one per infer rank.
//
// One request line in, one reply line out, in order:
//   {"op": "reset", "episode_id": "s3-p1-e2", "split": "train", "index": 17,
//    "task": {"prompt": ..., "answer": ..., ...}}       (task: with --data, the row; env_task)
//     -> {"episode_id": "s3-p1-e2", "messages": [{"role": "user", "content": "..."}],
//         "tools": [...]}                                  (tools optional)
//   {"op": "step", "episode_id": "s3-p1-e2", "message": {"role": "assistant", "content": "...",
//                                                        "tool_calls": [...]}}
//     -> {"episode_id": "s3-p1-e2", "messages": [{"role": "tool", "content": "..."}]}
//     or {"episode_id": "s3-p1-e2", "done": true, "reward": 1.0, "correct": true}
//                                                          (correct optional: reward > 0)
//   {"op": "close", "episode_id": "s3-p1-e2"}             (no reply: the job ended the episode)
//   {"op": "demonstration", "episode_id": "demo-train-17", "split": "train", "index": 17,
//    "task": {...}}                                       (task: as reset's)
//     -> {"episode_id": "demo-train-17", "demonstration": {"messages": [user, assistant with
//         tool_calls, tool, ..., the final assistant answer], "tools": [...]}}
//     or {"episode_id": "demo-train-17", "demonstration": null}   (none: no SFT warm-up)
//                                 (asked by the train ranks for the SFT warm-up: --sft-steps > 0)
// Failures end the episode with a named error and reward 0, and the job goes on:
//   env_died, env_timeout, env_malformed: as JsonLinesProcess (json_lines_process.h), and for
//                  env_died also a step of an episode whose process has died since its reset (the
//                  process is started again for the next reset); env_malformed also a reply that
//                  names another episode or has fields of the wrong type.
// The process and its environment variables: JsonLinesProcess (a clean environment: no CRL_*, no
// secrets; EnvOptions::pass_env adds names). Environments are where model-written tool calls run.
//
// Thread safety: reset/step/close may be called from any thread; requests are sent one at a time,
// by one worker thread the ProcessEnv owns (which also starts the process).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trainer/environment.h"
#include "trainer/json_lines_process.h"

namespace crl::trainer {

class ProcessEnv : public Environment {
 public:
  ProcessEnv(std::string command, const EnvOptions& options);
  ~ProcessEnv() override;
  ProcessEnv(const ProcessEnv&) = delete;
  ProcessEnv& operator=(const ProcessEnv&) = delete;

  std::string name() const override { return command_; }
  EnvReply reset(const std::string& episode_id, EnvSplit split, int64_t index,
                 const nlohmann::ordered_json& task = nullptr) override;
  EnvReply step(const std::string& episode_id, const nlohmann::ordered_json& assistant) override;
  void close(const std::string& episode_id) override;
  // Throws std::runtime_error naming the error when the process fails to answer.
  nlohmann::ordered_json demonstration(EnvSplit split, int64_t index,
                                       const nlohmann::ordered_json& task = nullptr) override;

  // Processes started so far (the first one included).
  int64_t starts() const;

 private:
  // Sends `request` and reads one reply line (on the worker thread); expect_reply false: send only.
  EnvReply exchange(const nlohmann::ordered_json& request, bool expect_reply, bool is_reset);
  EnvReply exchange_now(const nlohmann::ordered_json& request, bool expect_reply, bool is_reset);
  // A step or close of an episode whose process is gone (env_died; a close of one is nothing).
  std::optional<EnvReply> check_episode(const std::string& op, const std::string& episode_id,
                                        bool expect_reply);
  EnvReply read_demonstration(const nlohmann::ordered_json& j, const std::string& what,
                              const std::string& episode_id, const std::string& line);
  void worker();

  const std::string command_;
  JsonLinesProcess io_;  // only the worker thread talks through it (starts() from any)
  // The process each open episode was reset on (io_.starts() at its reset): a step of an episode
  // whose process is gone fails (env_died) without reaching the new one, which never saw it.
  std::map<std::string, int64_t> born_;  // the worker's
  // The request queue.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  std::thread thread_;
};

// EnvOptions::processes ProcessEnvs of one command (`--env-procs N`): a process answers one request
// at a time, so a single one serializes every episode's tool calls on the rank (N episodes each
// waiting on a one-second tool take N seconds a turn); a pool runs that many at once. An episode
// stays on the process it was reset on (the one with the fewest open episodes then); demonstrations
// go round the pool. Failures are each process's own (ProcessEnv), and a pool's process restarts
// alone. Thread safety as ProcessEnv.
class ProcessEnvPool : public Environment {
 public:
  ProcessEnvPool(const std::string& command, const EnvOptions& options);

  std::string name() const override { return envs_.front()->name(); }
  EnvReply reset(const std::string& episode_id, EnvSplit split, int64_t index,
                 const nlohmann::ordered_json& task = nullptr) override;
  EnvReply step(const std::string& episode_id, const nlohmann::ordered_json& assistant) override;
  void close(const std::string& episode_id) override;
  nlohmann::ordered_json demonstration(EnvSplit split, int64_t index,
                                       const nlohmann::ordered_json& task = nullptr) override;

  size_t size() const { return envs_.size(); }
  // Processes started so far, over the pool.
  int64_t starts() const;

 private:
  // The process of an open episode (-1: none; its step then fails as env_malformed).
  int64_t owner(const std::string& episode_id) const;
  // Drops an open episode from the bookkeeping: the process it was on, if it was open.
  std::optional<size_t> forget(const std::string& episode_id);

  std::vector<std::unique_ptr<ProcessEnv>> envs_;
  mutable std::mutex mu_;
  std::map<std::string, size_t> owner_;  // open episode -> process; guarded by mu_
  std::vector<int64_t> open_;            // open episodes per process; guarded by mu_
  size_t next_demo_ = 0;                 // guarded by mu_
};

}  // namespace crl::trainer

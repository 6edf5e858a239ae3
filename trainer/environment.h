// Environments for multi-turn RL (issue 28; docs/design.md §4).
//
// An Environment plays the other side of an episode: reset() opens it on a task (the opening
// messages and the tool schemas), step() answers each assistant message (tool results, or the
// end of the episode with its reward). Episodes are named by the caller (episode ids are unique
// within a job) and run concurrently: reset() and step() may be called from several threads at
// once, for different episodes.
//
// Tasks are (split, index) pairs: the job draws the index from its task rows and the environment
// decides what task `index` of a split is (the built-in calculator derives its operands from it;
// an external program may index its own data). The n trajectories of a GRPO group reset on the
// same task.
//
// make_environment(spec) (make_environment.h): "calculator" is the built-in tool environment
// (calculator_env.h); anything else is a command line, run by /bin/sh -c, that speaks JSON lines on
// stdin/stdout (process_env.h). An environment that fails (its process died, a malformed line, no
// reply in time) ends the episode with a named error (EnvReply::error, "env_died: ..."), reward 0;
// the job counts it and goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "trainer/tasks.h"

namespace crl::trainer {

enum class EnvSplit { kTrain, kEval };
const char* env_split_name(EnvSplit split);  // "train" | "eval"

// The environment's answer to reset() or step().
struct EnvReply {
  // reset: the opening conversation (system/user messages); step: the messages to append after
  // the assistant's (role "tool" results, or a "user" follow-up).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // reset only: the tool schemas the chat template shows ([{"type": "function", ...}]; null: none).
  nlohmann::ordered_json tools = nullptr;
  bool done = false;  // the episode is over: `reward` (and `correct`) are final
  double reward = 0;
  bool correct = false;  // counts toward accuracy (held-out success)
  // Set when the environment failed: "env_died: ...", "env_timeout: ..." or "env_malformed: ..."
  // (the kind before the colon). The episode ends with reward 0.
  std::string error;
  // op "demonstration" (ProcessEnv): {"messages", "tools"} or null.
  nlohmann::ordered_json demonstration = nullptr;
};

// A --data row as an environment's reset and demonstration get it ("task"): {"prompt": the text
// the model would see (a chat as its template rendered it), "messages": the chat as the file gives
// it (or null), "answer", "ground_truth" (as the file gives it), "data_source", "extra_info"}.
nlohmann::ordered_json env_task(const TaskRow& row);

// The kind of an EnvReply::error: its text before the first ':'.
std::string env_error_kind(const std::string& error);

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  // Opens episode `episode_id` on task `index` of `split`; `task` is that row of the job's --data
  // (env_task) when it has one, else null.
  virtual EnvReply reset(const std::string& episode_id, EnvSplit split, int64_t index,
                         const nlohmann::ordered_json& task = nullptr) = 0;
  // Answers the assistant's message (OpenAI form: role, content, tool_calls with arguments as
  // objects) in an episode reset before.
  virtual EnvReply step(const std::string& episode_id, const nlohmann::ordered_json& assistant) = 0;
  // The episode ended on the job's side (a turn or token cap, an error): forget it. Optional.
  virtual void close(const std::string& episode_id) { (void)episode_id; }
  // A worked episode for task `index`, for a supervised warm-up: {"messages": [user, assistant
  // tool calls, tool results, the final answer], "tools": the reset's tools}; null when the
  // environment has none. Throws std::runtime_error when the environment fails to answer.
  virtual nlohmann::ordered_json demonstration(EnvSplit split, int64_t index,
                                               const nlohmann::ordered_json& task = nullptr) {
    (void)split;
    (void)index;
    (void)task;
    return nullptr;
  }
};

struct EnvOptions {
  // Seeds the built-in environment's tasks.
  uint64_t seed = 1;
  // External environments: the longest wait for one reply line.
  std::chrono::milliseconds timeout{30000};
  // External environments: variables passed to the process beside the clean environment's few
  // (ProcessEnv; `--env-pass`). A name ending in '*' passes every variable with that prefix.
  std::vector<std::string> pass_env;
  // External environments: processes per infer rank (ProcessEnvPool). Each answers one request at
  // a time, so this many episodes' tool calls run at once.
  int32_t processes = 1;
  // The built-in calculator: digits of each operand.
  int32_t calculator_digits = 4;
  // The built-in calculator: operands of each task (N: N - 1 tool calls, N turns).
  int32_t calculator_operands = 2;
  // The built-in calculator's demonstrations: their final answer is the sum (false), or one of
  // three numbers of the conversation picked per task (the question's first and last operands, the
  // tool's last result): the format without the answer, which GRPO then learns from the reward
  // (`--sft-target demonstration`, the job's default).
  bool calculator_demo_any_number = false;
  // Injected latency of every step, uniform in [min, max] ms, seeded by the task index and the
  // step count, so two runs of the same tasks wait the same (`bench multi-turn`: tools that take
  // time); 0, 0: none.
  int32_t latency_min_ms = 0;
  int32_t latency_max_ms = 0;
  // Log-uniform instead of uniform in [min, max] (min > 0): most calls quick, a long tail, as
  // web searches and code runs are.
  bool latency_log_uniform = false;
};

// `inner` with EnvOptions' injected step latency (make_environment wraps with it when set).
class DelayedEnv : public Environment {
 public:
  DelayedEnv(std::unique_ptr<Environment> inner, const EnvOptions& options);
  std::string name() const override;
  EnvReply reset(const std::string& episode_id, EnvSplit split, int64_t index,
                 const nlohmann::ordered_json& task = nullptr) override;
  EnvReply step(const std::string& episode_id, const nlohmann::ordered_json& assistant) override;
  void close(const std::string& episode_id) override;
  nlohmann::ordered_json demonstration(EnvSplit split, int64_t index,
                                       const nlohmann::ordered_json& task = nullptr) override;

  // The wait of step `step` (0 first) of task `index` of `split`: the same in every run, whatever
  // the episode's id or the model's words.
  int32_t step_latency_ms(EnvSplit split, int64_t index, int64_t step) const;

 private:
  struct Open {
    EnvSplit split;
    int64_t index;
    int64_t steps;
  };
  void forget(const std::string& episode_id);

  std::unique_ptr<Environment> inner_;
  uint64_t seed_;
  int32_t min_ms_, max_ms_;
  bool log_uniform_;
  std::mutex mu_;
  std::map<std::string, Open> steps_;  // guarded by mu_
};

}  // namespace crl::trainer

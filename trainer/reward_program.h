// Rewards from a program (--reward COMMAND): verl users' compute_score(data_source, solution_str,
// ground_truth, extra_info), in any language, run by the job one process per infer rank, speaking
// JSON lines on its stdin/stdout (JsonLinesProcess: the clean environment, `--env-pass` names,
// process group, the --reward-timeout deadline). One request per group of completions of a prompt:
//   {"op": "score", "id": "s3-p1",
//    "items": [{"data_source": "openai/gsm8k", "prompt": "...", "completion": "...",
//               "ground_truth": "72", "extra_info": {...}}, ...]}
//     -> {"id": "s3-p1", "scores": [1.0, 0.0, {"score": 0.1, "correct": false, "acc": 0.0}]}
// A score is a number, or an object with a numeric "score", an optional boolean "correct" (else
// score > 0, as an environment's reward) and other numeric (or boolean) keys: extra metrics, each
// averaged over the completions that give it (reward_extra/<key>/mean in the metrics; up to 32
// keys named with [A-Za-z0-9_.-], at most 64 characters); other keys are ignored. A score must lie
// in [-1e6, 1e6]. "prompt" is the prompt text the model saw (a chat as its template rendered it),
// "ground_truth" the row's answer as the data file gives it (any JSON), "data_source" "" and
// "extra_info" null when the row has none.
// A program that fails does not stop the job: every completion of the request scores 0 (not
// correct), the error is counted (crl/reward_errors) and logged (the first few, then every 100th):
//   reward_died       it exited or closed its stdout (started again for the next request);
//   reward_timeout    no reply within the timeout (killed; started again for the next request);
//   reward_malformed  a reply that is not a JSON object, names another id, or whose "scores" is
//                     not a list of one valid score per completion (the process is stopped and
//                     started again for the next request: a late line cannot answer it).
// Thread safety: score() may be called from any thread; requests go one at a time. The process
// is started by the first score() and gets SIGKILL when the thread that started it ends: call it
// from a thread that lives as long as the job (the rollout thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/json_lines_process.h"
#include "trainer/tasks.h"

namespace crl::trainer {

// The scores of one prompt's completions.
struct ScoredGroup {
  std::vector<RewardResult> results;  // one per completion
  std::string error;                  // the program's failure ("": none); results are then 0
  // The program's extra metrics: per key, the sum over the completions that gave it and their
  // count.
  std::map<std::string, std::pair<double, int64_t>> extra;
};

class RewardProgram {
 public:
  RewardProgram(std::string command, std::chrono::milliseconds timeout,
                const std::vector<std::string>& pass_env);

  ScoredGroup score(const std::string& id, const TaskRow& row,
                    const std::vector<std::string>& completions);
  // Processes started so far.
  int64_t starts() const { return io_.starts(); }
  // Requests and failed requests so far.
  int64_t requests() const;
  int64_t errors() const;

 private:
  mutable std::mutex mu_;
  JsonLinesProcess io_;   // guarded by mu_
  int64_t requests_ = 0;  // guarded by mu_
  int64_t errors_ = 0;    // guarded by mu_
};

// The job's reward: the built-in kind of RewardOptions, or its program.
class Rewarder {
 public:
  // pass_env: the variables a program gets beside the clean environment's (`--env-pass`).
  Rewarder(const RewardOptions& options, const std::vector<std::string>& pass_env);
  ~Rewarder();

  // Scores `completions` of `row` (`id` names the request for a program's reply).
  ScoredGroup score(const std::string& id, const TaskRow& row,
                    const std::vector<std::string>& completions);
  bool is_program() const { return program_ != nullptr; }

 private:
  RewardOptions options_;
  std::unique_ptr<RewardProgram> program_;
};

}  // namespace crl::trainer

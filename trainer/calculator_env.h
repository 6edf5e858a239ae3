// CalculatorEnv: the built-in tool environment (issue 28), learnable by the embedded default
// model on CPU.
//
// Task `index` of a split: "Question: what is A plus B?" with A and B of `digits` digits each
// (seeded by the split, the index and the job's seed; train and eval tasks differ), more than the
// small model can add in one step; with `operands` N > 2, "A plus B plus C ..." (the first two
// operands are the same as at N = 2). One tool, "add" ({"a": integer, "b": integer}; numeric
// strings are accepted): each call is answered with a tool message holding the sum, or an error
// text for an unknown tool or bad arguments (the episode goes on). An assistant message without
// tool calls is the final answer: the episode ends with reward 1 when its first integer is the
// sum, else 0. The demonstration adds one operand a turn (N - 1 calls, then the answer: N turns);
// its answer is the sum, or with `calculator_demo_any_number` one of the question's first and last
// operands and the sum, picked per task from a stream of its own (the calls stay right).
//
// Thread safety: all methods may be called concurrently (episodes are kept under a mutex).
#pragma once

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "trainer/environment.h"

namespace crl::trainer {

class CalculatorEnv : public Environment {
 public:
  explicit CalculatorEnv(const EnvOptions& options);

  std::string name() const override { return "calculator"; }
  // `task` is ignored: the calculator makes its own (the job refuses --data with it).
  EnvReply reset(const std::string& episode_id, EnvSplit split, int64_t index,
                 const nlohmann::ordered_json& task = nullptr) override;
  EnvReply step(const std::string& episode_id, const nlohmann::ordered_json& assistant) override;
  void close(const std::string& episode_id) override;
  nlohmann::ordered_json demonstration(EnvSplit split, int64_t index,
                                       const nlohmann::ordered_json& task = nullptr) override;

  // The operands of task `index` of `split`.
  std::vector<int64_t> operands(EnvSplit split, int64_t index) const;
  // The opening user message of a task, and the tool schemas.
  static std::string question(const std::vector<int64_t>& operands);
  static nlohmann::ordered_json tools();
  // The final answer of task `index`'s demonstration.
  int64_t demonstration_answer(EnvSplit split, int64_t index) const;

 private:
  uint64_t seed_;
  int32_t digits_;
  int32_t num_operands_;
  bool demo_any_number_;
  std::mutex mu_;
  std::map<std::string, int64_t> episodes_;  // the sum of each open episode; guarded by mu_
};

}  // namespace crl::trainer

// The single-process RL loop on the embedded default model and the built-in copy task.
#include "trainer/local_rl.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>

#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

// The default task's recipe: SFT warm-up (lr 1e-3) into GRPO (lr 1e-4), 16 prompts x 8 samples.
LocalRlOptions default_recipe(int64_t sft_steps, int64_t grpo_steps) {
  LocalRlOptions o;
  o.seed = 1;
  o.sft_steps = sft_steps;
  o.sft_rows_per_step = 32;
  o.sft_trainer.schedule.lr = 1e-3;
  o.sft_trainer.schedule.warmup_steps = 5;
  o.grpo_steps = grpo_steps;
  o.prompts_per_step = 16;
  o.samples_per_prompt = 8;
  o.temperature = 1.0;
  o.max_tokens = 8;
  o.trainer.schedule.lr = 1e-4;
  o.eval_rows = 128;
  return o;
}

double mean_reward(const std::vector<StepMetrics>& steps, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += steps[i].reward_mean;
  return s / static_cast<double>(end - begin);
}

TEST(LocalRlTest, SeededTinyRunRaisesRewardAndHeldOutAccuracy) {
  test::TempDir dir;
  LocalRlOptions o = default_recipe(/*sft_steps=*/100, /*grpo_steps=*/16);
  o.eval_every = 0;
  o.metrics_path = dir.file("metrics.jsonl");
  o.checkpoint_dir = dir.file("ckpt");
  LocalRlResult r = run_local_rl(o);

  ASSERT_EQ(r.grpo_steps.size(), 16u);
  const size_t k = 5;
  const double first = mean_reward(r.grpo_steps, 0, k);
  const double last = mean_reward(r.grpo_steps, r.grpo_steps.size() - k, r.grpo_steps.size());
  EXPECT_GT(last, first) << "mean reward of the first " << k << " GRPO steps " << first
                         << ", of the last " << k << " " << last;
  ASSERT_EQ(r.evals.size(), 3u);  // start, after SFT, end
  EXPECT_EQ(r.evals[0].phase, "start");
  EXPECT_EQ(r.evals[1].phase, "sft");
  EXPECT_GT(r.evals[2].accuracy, r.evals[1].accuracy) << "GRPO should improve on the warm-up";
  for (const auto& m : r.grpo_steps) {
    EXPECT_LT(m.logprob_gap_max, 1e-4) << "step " << m.step;
    EXPECT_EQ(m.weight_version, m.step + 1);  // one sync after SFT, one per GRPO step
  }
  std::ifstream in(o.metrics_path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 100 + 16);
  engine::EngineConfig cfg;
  cfg.model_dir = o.checkpoint_dir;
  engine::LlmEngine eng(cfg);  // the final checkpoint loads in the engine
  std::cout << "tiny run: held-out " << r.evals[0].accuracy << " -> " << r.evals[1].accuracy
            << " (SFT) -> " << r.evals[2].accuracy << " (GRPO); reward " << first << " -> "
            << last << "; " << r.wall_seconds << " s\n";
}

TEST(LocalRlTest, DeterministicEngineAndTrainerAgreeExactlyAfterEveryUpdate) {
  LocalRlOptions o = default_recipe(/*sft_steps=*/0, /*grpo_steps=*/3);
  o.deterministic = true;
  o.prompts_per_step = 4;
  o.samples_per_prompt = 4;
  o.eval_rows = 8;
  o.trainer.schedule.lr = 1e-3;  // big updates: the engine must follow them exactly
  LocalRlResult r = run_local_rl(o);
  ASSERT_EQ(r.grpo_steps.size(), 3u);
  for (const auto& m : r.grpo_steps) EXPECT_EQ(m.logprob_gap_max, 0.0) << "step " << m.step;
}

TEST(LocalRlTest, MessagesRowsTrainWithTheModelsChatTemplate) {
  test::TempDir dir;
  const std::string model = test::test_model_with_tokenizer_config(
      dir.file("model"), R"({"bos_token": "<s>", "chat_template": "{{ bos_token }})"
                         R"({% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %})"
                         R"({% if add_generation_prompt %}assistant:{% endif %}"})");
  {
    std::ofstream data(dir.file("chat.jsonl"));
    for (const char* words : {"red tree", "big book", "old river", "quick lazy", "dark young"}) {
      data << R"({"messages": [{"role": "system", "content": "Copy the words."}, )"
           << R"({"role": "user", "content": ")" << words << R"("}], "answer": ")" << words
           << "\"}\n";
    }
  }
  LocalRlOptions o = default_recipe(/*sft_steps=*/1, /*grpo_steps=*/1);
  o.model_dir = model;
  o.data_path = dir.file("chat.jsonl");
  o.eval_rows = 1;
  o.sft_rows_per_step = 2;
  o.prompts_per_step = 2;
  o.samples_per_prompt = 2;
  o.max_tokens = 4;
  LocalRlResult r = run_local_rl(o);
  EXPECT_EQ(r.sft_steps.size(), 1u);
  EXPECT_EQ(r.grpo_steps.size(), 1u);
}

// The measurement behind the README numbers (a few minutes): CRL_LONG_TESTS=1.
TEST(LocalRlTest, DefaultTaskHeldOutAccuracyRisesByThirtyPoints) {
  if (!std::getenv("CRL_LONG_TESTS")) GTEST_SKIP() << "set CRL_LONG_TESTS=1 to run";
  LocalRlOptions o = default_recipe(/*sft_steps=*/100, /*grpo_steps=*/60);
  o.eval_every = 5;
  o.log = [](const std::string& line) { std::cout << line << std::endl; };
  LocalRlResult r = run_local_rl(o);
  std::cout << "held-out accuracy curve (phase step accuracy elapsed_s):\n";
  for (const auto& e : r.evals) {
    std::cout << "  " << e.phase << " " << e.step << " " << e.accuracy << " " << e.elapsed_s << "\n";
  }
  std::cout << "wall " << r.wall_seconds << " s (SFT " << r.sft_seconds << " s, GRPO "
            << r.grpo_seconds << " s)\n";
  EXPECT_GE(r.evals.back().accuracy - r.evals.front().accuracy, 0.30);
  EXPECT_GE(r.evals.back().accuracy - r.evals[1].accuracy, 0.15) << "GRPO's own share";
}

}  // namespace
}  // namespace crl::trainer

#include "trainer/tasks.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "engine/model/model_cache.h"
#include "engine/tokenizer.h"
#include "tests/test_utils.h"

namespace crl::trainer {
namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(TaskTest, RewardsScoreTheFirstLineOfTheCompletion) {
  RewardOptions exact;
  EXPECT_TRUE(score_completion(exact, " red cat \nmore", "red cat").correct);
  EXPECT_FALSE(score_completion(exact, " red cats", "red cat").correct);
  RewardOptions numeric;
  numeric.kind = RewardKind::kNumeric;
  EXPECT_TRUE(score_completion(numeric, " 12 apples", "12").correct);
  EXPECT_TRUE(score_completion(numeric, "x = 3.50", "3.5").correct);
  EXPECT_FALSE(score_completion(numeric, "13", "12").correct);
  EXPECT_FALSE(score_completion(numeric, "no number", "12").correct);
  RewardOptions regex;
  regex.kind = RewardKind::kRegex;
  EXPECT_TRUE(score_completion(regex, " Paris", "[Pp]aris").correct);
  EXPECT_FALSE(score_completion(regex, " Paris, France", "[Pp]aris").correct);  // whole match
  RewardOptions format;
  format.kind = RewardKind::kFormat;
  format.format_regex = R"(-?\d+)";
  EXPECT_EQ(score_completion(format, " 42\n", "ignored").reward, 1.0);
  EXPECT_EQ(score_completion(format, " forty-two", "ignored").reward, 0.0);
  numeric.format_regex = R"(-?\d+)";
  numeric.format_weight = 0.25;
  EXPECT_EQ(score_completion(numeric, "41", "42").reward, 0.25);
  EXPECT_EQ(score_completion(numeric, "42", "42").reward, 1.25);
}

TEST(TaskTest, BadRowsAreAllReportedWithFileAndLineAndNothingLoads) {
  test::TempDir dir;
  const std::string path = dir.file("data.jsonl");
  write(path,
        "{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n"
        "{\"prompt\": \"3+3=\", \"answer\": 6}\n"
        "\n"
        "{\"prompt\": \"oops\", \"answer\": \n"
        "{\"answer\": \"5\"}\n"
        "{\"prompt\": 7, \"answer\": \"7\"}\n"
        "{\"prompt\": \"x\", \"answer\": [1]}\n"
        "[1, 2]\n"
        "{\"prompt\": \"  \", \"answer\": \"1\"}\n");
  try {
    load_task_jsonl(path);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("6 bad rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":4: invalid JSON"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":5: missing field \"prompt\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":6: \"prompt\" must be a string, got number"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":7: \"answer\" must be a string or a number, got array"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":8: expected a JSON object"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":9: \"prompt\" is empty"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(":2:"), std::string::npos) << "numeric answers are fine: " << msg;
  }
  write(path, "{\"prompt\": \"a\", \"answer\": \"(\"}\n{\"prompt\": \"b\", \"answer\": \"x\"}\n");
  RewardOptions regex;
  regex.kind = RewardKind::kRegex;
  ASSERT_THROWS_WITH(load_task_jsonl(path, regex), std::invalid_argument, ":1: bad answer regex");
  RewardOptions numeric;
  numeric.kind = RewardKind::kNumeric;
  ASSERT_THROWS_WITH(load_task_jsonl(path, numeric), std::invalid_argument, ":2: \"answer\" \"x\" is not a number");
  auto rows = load_task_jsonl(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].line, 2);
  ASSERT_THROWS_WITH(load_task_jsonl(dir.file("missing.jsonl")), std::invalid_argument, "missing.jsonl");
}

TEST(TaskTest, EvalSplitIsHeldOutAndSeeded) {
  auto rows = default_task_rows(100, 3);
  auto a = split_task(rows, 20, 9);
  auto b = split_task(rows, 20, 9);
  ASSERT_EQ(a.eval.size(), 20u);
  ASSERT_EQ(a.train.size(), 80u);
  for (size_t i = 0; i < a.eval.size(); ++i) EXPECT_EQ(a.eval[i].prompt, b.eval[i].prompt);
  ASSERT_THROWS_WITH(split_task(rows, 60, 1), std::invalid_argument,
                     "--eval-rows 60 holds out more than half of the 100 task rows; use --eval-rows 50");
}

TEST(TaskTest, DefaultEvalSplitFitsTheData) {
  // A small --data file must work without --eval-rows: a fifth, at least 1, at most 128.
  EXPECT_EQ(split_task(default_task_rows(100, 3), -1, 9).eval.size(), 20u);
  EXPECT_EQ(split_task(default_task_rows(4000, 3), -1, 9).eval.size(), 128u);
  auto two = split_task(default_task_rows(2, 3), -1, 9);
  EXPECT_EQ(two.eval.size(), 1u);
  EXPECT_EQ(two.train.size(), 1u);
  EXPECT_EQ(split_task(default_task_rows(1, 3), -1, 9).eval.size(), 0u);
}

TEST(TaskTest, DefaultTaskWordsAreSinglePiecesOfTheDefaultTokenizer) {
  engine::Tokenizer tok(engine::ensure_default_tokenizer());
  auto rows = default_task_rows(200, 1);
  std::set<std::string> distinct;
  for (const auto& r : rows) {
    distinct.insert(r.prompt);
    int64_t words = 1;
    for (char c : r.answer) words += c == ' ';
    EXPECT_EQ(static_cast<int64_t>(tok.encode(r.answer).size()), words) << r.answer;
    EXPECT_EQ(r.prompt.rfind("Copy: " + r.answer + ". Answer:", 0), 0u) << r.prompt;
    EXPECT_EQ(tok.decode(tok.encode(r.answer)), r.answer);
  }
  EXPECT_GT(distinct.size(), 150u);
}

}  // namespace
}  // namespace crl::trainer

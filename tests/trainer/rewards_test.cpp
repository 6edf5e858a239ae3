// Rewards beyond the first line (issue 52): the answer part the built-in rewards judge
// (--answer-extract), verl's data rows, and reward programs (--reward COMMAND), including ones
// that die, hang, lie and flood (tests/fixtures/rewards/test_reward.py), and the GSM8K example
// users copy (examples/rewards/gsm8k.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "trainer/reward_program.h"
#include "trainer/tasks.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;
using std::chrono::milliseconds;

std::string test_reward(const std::string& flags = "") {
  return "python3 " + std::string(CRL_FIXTURES_DIR) + "/rewards/test_reward.py " + flags;
}

TaskRow row_with_answer(const std::string& answer) {
  TaskRow row;
  row.prompt = "What is 6 x 7?";
  row.answer = answer;
  return row;
}

std::optional<std::string> part(const std::string& completion, const std::string& spec) {
  return extract_answer(completion, parse_answer_extract(spec));
}

TEST(AnswerExtractTest, EachFormTakesItsPartOfTheCompletion) {
  const std::string cot = "6 x 7 = 42.\nSo the answer is 42.\n#### 42\n";
  EXPECT_EQ(part(cot, "first-line"), "6 x 7 = 42.");
  EXPECT_EQ(part(cot, "last-line"), "#### 42");
  EXPECT_EQ(part(cot, "after:####"), "42");
  EXPECT_EQ(part("#### 1\n#### 2 apples\nbye", "after:####"), "2 apples");  // the last marker
  EXPECT_EQ(part("no marker", "after:####"), std::nullopt);
  EXPECT_EQ(part(cot, "full"), "6 x 7 = 42.\nSo the answer is 42.\n#### 42");
  EXPECT_EQ(part("  \n \n", "last-line"), "");
  // \boxed: the last one, braces balanced, spaces allowed, \fbox too, the brace-less form.
  EXPECT_EQ(part("\\boxed{1} then $\\boxed{\\frac{1}{2}}$.", "boxed"), "\\frac{1}{2}");
  EXPECT_EQ(part("so \\boxed {42}", "boxed"), "42");
  EXPECT_EQ(part("\\fbox{7} ok", "boxed"), "7");
  EXPECT_EQ(part("answer: $\\boxed 42$ done", "boxed"), "42");
  EXPECT_EQ(part("cut off \\boxed{\\frac{1}{2", "boxed"), std::nullopt);
  EXPECT_EQ(part("\\boxedx{1}", "boxed"), std::nullopt);
  EXPECT_EQ(part("no box", "boxed"), std::nullopt);
  EXPECT_EQ(answer_extract_name(parse_answer_extract("after:####")), "after:####");
  for (const char* bad : {"first", "after:", "boxed{}", ""}) {
    EXPECT_THROW(parse_answer_extract(bad), std::invalid_argument) << bad;
  }
}

TEST(AnswerExtractTest, GsmAndBoxedCompletionsScoreThroughTheBuiltInRewards) {
  RewardOptions after;
  after.kind = RewardKind::kNumeric;
  after.extract = parse_answer_extract("after:####");
  EXPECT_TRUE(score_completion(after, "Each box has 7.\n6 boxes: 42.\n#### 42", "42").correct);
  EXPECT_TRUE(score_completion(after, "#### $1,234", "1234").correct);  // GSM8K's numbers
  EXPECT_TRUE(score_completion(after, "#### 1234", "1,234").correct);
  EXPECT_FALSE(score_completion(after, "#### 1,23", "123").correct);  // not a separator
  EXPECT_FALSE(score_completion(after, "42 is it\n", "42").correct);  // no marker: 0
  EXPECT_FALSE(score_completion(after, "42 is it\n", "42").well_formed);
  RewardOptions boxed;
  boxed.kind = RewardKind::kExact;
  boxed.extract = parse_answer_extract("boxed");
  EXPECT_EQ(score_completion(boxed, "Thus $\\boxed{42}$.", "42").reward, 1.0);
  EXPECT_EQ(score_completion(boxed, "Thus $\\boxed{41}$.", "42").reward, 0.0);
  // The first line, as before, is the default: the chain of thought's first line is judged.
  RewardOptions first;
  EXPECT_FALSE(score_completion(first, "6 x 7 is\n#### 42", "42").correct);
  EXPECT_EQ(describe_reward(after), "numeric on what follows the last '####'");
  RewardOptions program;
  program.program = "python3 r.py";
  EXPECT_EQ(describe_reward(program), "program 'python3 r.py'");
}

TEST(VerlRowsTest, PromptAsChatGroundTruthDataSourceAndExtraInfoLoad) {
  test::TempDir dir;
  const std::string path = dir.file("verl.jsonl");
  const ojson verl = {
      {"data_source", "openai/gsm8k"},
      {"prompt", ojson::array({{{"role", "user"}, {"content", "6 x 7? Let's think."}}})},
      {"ability", "math"},
      {"reward_model", {{"style", "rule"}, {"ground_truth", "42"}}},
      {"extra_info", {{"split", "train"}, {"index", 3}}}};
  std::ofstream(path) << verl.dump() << "\n"
                      << R"({"prompt": "plain", "answer": 7, "data_source": "mine"})"
                      << "\n";
  const std::string model = test::test_model_dir("llama");  // the built-in chat format
  const std::vector<TaskRow> rows = load_task_jsonl(path, {}, model);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].kind, PromptKind::kBuiltinChat);
  EXPECT_NE(rows[0].prompt.find("6 x 7? Let's think."), std::string::npos) << rows[0].prompt;
  EXPECT_EQ(rows[0].answer, "42");
  EXPECT_EQ(rows[0].ground_truth_json, "\"42\"");
  EXPECT_EQ(rows[0].data_source, "openai/gsm8k");
  EXPECT_EQ(ojson::parse(rows[0].extra_info_json), verl["extra_info"]);
  EXPECT_EQ(rows[1].kind, PromptKind::kText);
  EXPECT_EQ(rows[1].answer, "7");
  EXPECT_EQ(rows[1].data_source, "mine");
  EXPECT_EQ(rows[1].extra_info_json, "");
}

TEST(VerlRowsTest, GroundTruthBeyondTextNeedsAProgramAndBadFieldsAreNamed) {
  test::TempDir dir;
  const std::string path = dir.file("d.jsonl");
  std::ofstream(path) << R"({"prompt": "p", "reward_model": {"ground_truth": ["a", "b"]}})"
                      << "\n"
                      << R"({"prompt": "p", "answer": "1", "data_source": 3})"
                      << "\n"
                      << R"({"prompt": "p", "reward_model": {"style": "rule"}})"
                      << "\n"
                      << R"({"prompt": [{"role": "user", "content": "x"}], "messages": [], )"
                      << R"("answer": "1"})"
                      << "\n";
  try {
    load_task_jsonl(path);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path + ":1: \"reward_model.ground_truth\" must be a string or a number, "
                              "got array (a reward program, --reward COMMAND, takes any JSON)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":2: \"data_source\" must be a string, got number"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":3: missing field \"answer\" (or verl's \"reward_model\": "
                              "{\"ground_truth\": ...})"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":4: has both \"prompt\" (a chat) and \"messages\""),
              std::string::npos)
        << msg;
  }
  // With a program the list is the ground truth, as the file gives it.
  std::ofstream(path) << R"({"prompt": "p", "reward_model": {"ground_truth": ["a", "b"]}})"
                      << "\n";
  RewardOptions program;
  program.program = "true";
  const auto rows = load_task_jsonl(path, program);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].ground_truth_json, R"(["a","b"])");
}

TEST(VerlRowsTest, AParquetFileIsRefusedWithTheCommandThatConvertsIt) {
  test::TempDir dir;
  const std::string path = dir.file("train.parquet");
  std::ofstream(path, std::ios::binary) << std::string("PAR1\x15\x04\x15", 7);
  try {
    load_task_jsonl(path);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  " is a Parquet file (verl's data format); --data reads JSON lines: convert "
                  "it with `python3 scripts/verl_to_jsonl.py " +
                  path + " OUT.jsonl` (needs pyarrow)");
  }
}

TEST(RewardProgramTest, ScoresEachCompletionWithExtraMetricsOverJsonLines) {
  RewardProgram p(test_reward(), milliseconds(20000), {});
  const ScoredGroup g = p.score("s0p1", row_with_answer("42"), {"it is 42", "it is 41", "42!"});
  ASSERT_EQ(g.error, "");
  ASSERT_EQ(g.results.size(), 3u);
  EXPECT_EQ(g.results[0].reward, 1.0);
  EXPECT_TRUE(g.results[0].correct);
  EXPECT_EQ(g.results[1].reward, 0.0);
  EXPECT_FALSE(g.results[1].correct);  // score > 0 is correct when the program does not say
  EXPECT_EQ(g.results[2].reward, 1.0);
  ASSERT_EQ(g.extra.size(), 1u);  // "length"; the text key "note" is no metric
  EXPECT_EQ(g.extra.at("length").first, 8 + 8 + 3);
  EXPECT_EQ(g.extra.at("length").second, 3);
  EXPECT_EQ(p.starts(), 1);
  EXPECT_EQ(p.errors(), 0);
}

TEST(RewardProgramTest, ADyingProgramScoresZeroNamedAndIsStartedAgain) {
  RewardProgram p(test_reward("--die --after 1"), milliseconds(20000), {});
  EXPECT_EQ(p.score("a", row_with_answer("42"), {"42"}).results[0].reward, 1.0);
  const ScoredGroup g = p.score("b", row_with_answer("42"), {"42", "42"});
  EXPECT_EQ(
      g.error.rfind("reward_died: the reward program process (" + test_reward("--die --after 1") +
                        ") closed its stdout at the score request 'b' "
                        "(exit status 3)",
                    0),
      0u)
      << g.error;
  ASSERT_EQ(g.results.size(), 2u);
  EXPECT_EQ(g.results[0].reward, 0.0);
  EXPECT_FALSE(g.results[1].correct);
  // Started again: its first request (--after 1) is answered.
  EXPECT_EQ(p.score("c", row_with_answer("42"), {"42"}).error, "");
  EXPECT_EQ(p.starts(), 2);
  EXPECT_EQ(p.errors(), 1);
}

TEST(RewardProgramTest, AHangingProgramTimesOutAndIsKilled) {
  RewardProgram p(test_reward("--hang"), milliseconds(700), {});
  const auto t0 = std::chrono::steady_clock::now();
  const ScoredGroup g = p.score("h", row_with_answer("42"), {"42"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(g.error.rfind("reward_timeout: no reply from the reward program (", 0), 0u) << g.error;
  EXPECT_NE(g.error.find("within 700 ms to the score request 'h'"), std::string::npos) << g.error;
  EXPECT_EQ(g.results[0].reward, 0.0);
  // Killed: the next request starts a new process (which hangs too).
  EXPECT_EQ(p.score("h2", row_with_answer("42"), {"42"}).error.rfind("reward_timeout", 0), 0u);
  EXPECT_EQ(p.starts(), 2);
  EXPECT_EQ(p.requests(), 2);
  EXPECT_EQ(p.errors(), 2);
}

TEST(RewardProgramTest, LyingRepliesAreNamedMalformedAndScoreZero) {
  const std::pair<const char*, const char*> cases[] = {
      {"--garbage", "is not a JSON object: {not json either"},  // the line before: no reply
      {"--wrong-id", "it names id \"someone-else\", the request 'x'"},
      {"--short", "1 scores for 2 completions"},
      {"--nan", "is not a JSON object: {\"id\": \"x\", \"scores\": [NaN"},    // NaN: no JSON
      {"--inf", "is not a JSON object: {\"id\": \"x\", \"scores\": [1e999"},  // out of range
      {"--text", "score 0: a score must be a number, got string"},
      {"--huge", "score 0: a score outside [-1e6, 1e6]"},
  };
  for (const auto& [flag, why] : cases) {
    SCOPED_TRACE(flag);
    RewardProgram p(test_reward(flag), milliseconds(20000), {});
    const ScoredGroup g = p.score("x", row_with_answer("42"), {"42", "42"});
    EXPECT_EQ(g.error.rfind("reward_malformed: the reply to the score request 'x'", 0), 0u)
        << g.error;
    EXPECT_NE(g.error.find(why), std::string::npos) << g.error;
    EXPECT_EQ(g.results[0].reward + g.results[1].reward, 0.0);
    EXPECT_TRUE(g.extra.empty());
    // Stopped after a malformed reply: the next request has a process of its own.
    p.score("y", row_with_answer("42"), {"42"});
    EXPECT_EQ(p.starts(), 2);
  }
}

TEST(RewardProgramTest, AFloodOfNonRepliesIsDroppedAndTheReplyStillCounts) {
  RewardProgram p(test_reward("--flood"), milliseconds(20000), {});
  for (int i = 0; i < 2; ++i) {
    const ScoredGroup g = p.score("f" + std::to_string(i), row_with_answer("42"), {"42"});
    EXPECT_EQ(g.error, "");
    EXPECT_EQ(g.results[0].reward, 1.0);
  }
}

TEST(RewardProgramTest, TheProgramGetsACleanEnvironmentAndWhatIsPassed) {
  ::setenv("CRL_API_KEY", "secret", 1);
  ::setenv("CRL_TEST_REWARD_TOKEN", "t", 1);
  RewardProgram p(test_reward("--echo-env CRL_API_KEY,CRL_TEST_REWARD_TOKEN,PATH"),
                  milliseconds(20000), {"CRL_TEST_REWARD_*"});
  const ScoredGroup g = p.score("e", row_with_answer("42"), {"x"});
  ::unsetenv("CRL_API_KEY");
  ::unsetenv("CRL_TEST_REWARD_TOKEN");
  ASSERT_EQ(g.error, "");
  EXPECT_EQ(g.extra.at("CRL_API_KEY").first, 0);
  EXPECT_EQ(g.extra.at("CRL_TEST_REWARD_TOKEN").first, 1);
  EXPECT_EQ(g.extra.at("PATH").first, 1);
}

// The example users copy, examples/rewards/gsm8k.py: verl's GSM8K rule (strict: the number after
// the last "#### " in the last 300 characters, commas and dollars dropped).
TEST(RewardProgramTest, TheGsm8kExampleScoresAsVerlsRule) {
  RewardProgram p("python3 " + std::string(CRL_SOURCE_DIR) + "/examples/rewards/gsm8k.py",
                  milliseconds(20000), {});
  TaskRow row = row_with_answer("1234");
  row.data_source = "openai/gsm8k";
  row.ground_truth_json = "\"1234\"";
  const ScoredGroup g =
      p.score("g", row,
              {"So 1,000 + 234 = 1,234.\n#### 1,234", "#### 1233", "1234",
               "#### $1234" /* verl's pattern takes no '$' there */,
               "#### 1234" + std::string(300, ' ') /* past the last 300 characters */});
  ASSERT_EQ(g.error, "");
  const double want[] = {1, 0, 0, 0, 0};
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(g.results[k].reward, want[k]) << k;
  EXPECT_EQ(g.extra.at("has_answer").first, 2);
  // --format-score: a wrong "#### " answer gets it, none gets 0.
  RewardProgram f(
      "python3 " + std::string(CRL_SOURCE_DIR) + "/examples/rewards/gsm8k.py --format-score 0.25",
      milliseconds(20000), {});
  const ScoredGroup h = f.score("h", row, {"#### 1233", "1234", "#### 1,234"});
  ASSERT_EQ(h.error, "");
  EXPECT_EQ(h.results[0].reward, 0.25);
  EXPECT_FALSE(h.results[0].correct);
  EXPECT_EQ(h.results[1].reward, 0.0);
  EXPECT_EQ(h.results[2].reward, 1.0);
}

TEST(RewarderTest, BuiltInKindsOrTheProgram) {
  RewardOptions o;
  o.extract = parse_answer_extract("after:####");
  Rewarder builtin(o, {});
  const ScoredGroup b = builtin.score("i", row_with_answer("42"), {"x\n#### 42", "42"});
  EXPECT_EQ(b.results[0].reward, 1.0);
  EXPECT_EQ(b.results[1].reward, 0.0);
  o.program = test_reward();
  Rewarder program(o, {});
  EXPECT_EQ(program.score("i", row_with_answer("42"), {"42"}).extra.count("length"), 1u);
}

}  // namespace
}  // namespace crl::trainer

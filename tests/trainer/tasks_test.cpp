#include "trainer/tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/model/model_cache.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

const ojson& chat_fixture(const std::string& file) {
  static std::map<std::string, ojson> cache;
  auto it = cache.find(file);
  if (it == cache.end()) {
    std::ifstream in(std::string(CRL_FIXTURES_DIR) + "/chat_templates/" + file);
    it = cache.emplace(file, ojson::parse(in)).first;
  }
  return it->second;
}

// A test model directory whose tokenizer_config.json carries the real template `name` of the
// fixtures (with its bos/eos tokens).
std::string model_with_fixture_template(const test::TempDir& dir, const std::string& name) {
  for (const auto& t : chat_fixture("templates.json")) {
    if (t["name"] != name) continue;
    const ojson config = {{"chat_template", t["template"]},
                          {"bos_token", t["bos_token"]},
                          {"eos_token", t["eos_token"]}};
    return test::test_model_with_tokenizer_config(dir.file(name), config.dump());
  }
  ADD_FAILURE() << "no fixture template " << name;
  return "";
}

// The fixtures' case `case_name` of template `name` (variables and python3-jinja2's render).
const ojson& fixture_case(const std::string& name, const std::string& case_name) {
  for (const auto& c : chat_fixture("expected.json")["cases"]) {
    if (c["template"] == name && c["case"] == case_name) return c;
  }
  throw std::runtime_error("no fixture case " + name + " / " + case_name);
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
    EXPECT_NE(
        msg.find(path + ":6: \"prompt\" must be a string or a list of chat messages, got number"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":7: \"answer\" must be a string or a number, got array"),
              std::string::npos)
        << msg;
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
  ASSERT_THROWS_WITH(load_task_jsonl(path, numeric), std::invalid_argument,
                     ":2: \"answer\" \"x\" is not a number");
  auto rows = load_task_jsonl(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].line, 2);
  ASSERT_THROWS_WITH(load_task_jsonl(dir.file("missing.jsonl")), std::invalid_argument,
                     "missing.jsonl");
}

TEST(TaskTest, ADemonstrationIsWhatTheWarmUpTrainsOn) {
  test::TempDir dir;
  const std::string path = dir.file("data.jsonl");
  write(path,
        "{\"prompt\": \"2+3=\", \"answer\": \"5\", \"demonstration\": \"2+3 is 5\"}\n"
        "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n");
  auto rows = load_task_jsonl(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].demonstration, "2+3 is 5");
  EXPECT_EQ(rows[0].answer, "5");
  EXPECT_EQ(rows[1].demonstration, "");  // the warm-up trains on the answer
  write(path, "{\"prompt\": \"2+3=\", \"answer\": \"5\", \"demonstration\": 5}\n");
  ASSERT_THROWS_WITH(load_task_jsonl(path), std::invalid_argument,
                     ":1: \"demonstration\" must be a string, got number");
}

TEST(TaskTest, MessagesRowsRenderWithTheModelsTemplateLikePythonJinja2) {
  test::TempDir dir;
  for (const char* name :
       {"Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct", "Qwen3", "SmolLM2-Instruct",
        "Mistral-7B-Instruct-v0.3", "DeepSeek-R1-Distill-Qwen-32B"}) {
    SCOPED_TRACE(name);
    const std::string model = model_with_fixture_template(dir, name);
    // python3-jinja2's render of a system prompt and several turns with add_generation_prompt.
    const ojson& c = fixture_case(name, "system_multi_turn_gen");
    ASSERT_TRUE(c["variables"]["add_generation_prompt"].get<bool>());
    const std::string path = dir.file(std::string(name) + ".jsonl");
    write(path, ojson({{"prompt", "plain text"}, {"answer", "x"}}).dump() + "\n" +
                    ojson({{"messages", c["variables"]["messages"]}, {"answer", 4}}).dump() + "\n");
    const std::vector<TaskRow> rows = load_task_jsonl(path, {}, model);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].kind, PromptKind::kText);
    EXPECT_EQ(rows[0].prompt, "plain text");
    EXPECT_EQ(rows[1].kind, PromptKind::kChat);
    EXPECT_EQ(rows[1].prompt, c["expected"].get<std::string>());  // byte-equal
    EXPECT_EQ(rows[1].answer, "4");
    EXPECT_EQ(rows[1].line, 2);
  }
}

TEST(TaskTest, MessagesRowsOfAModelWithoutTemplateUseTheBuiltinFormat) {
  test::TempDir dir;
  const std::string path = dir.file("data.jsonl");
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "2+2?"}])");
  write(path, ojson({{"messages", messages}, {"answer", "4"}}).dump() + "\n");
  const std::string model = test::test_model_dir("llama");
  const std::vector<TaskRow> rows = load_task_jsonl(path, {}, model);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, PromptKind::kBuiltinChat);
  EXPECT_EQ(rows[0].prompt, text::ChatTemplate::from_model_dir(model).render(messages));
}

TEST(TaskTest, BadMessagesRowsNameTheFileAndLine) {
  test::TempDir dir;
  // Mistral v0.1 raises unless roles alternate user/assistant.
  const std::string model = model_with_fixture_template(dir, "Mistral-7B-Instruct-v0.1");
  const std::string path = dir.file("chat.jsonl");
  write(path,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": \"1\"}\n"
        "{\"prompt\": \"p\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
        "\"answer\": \"1\"}\n"
        "{\"answer\": \"1\"}\n"
        "{\"messages\": \"hi\", \"answer\": \"1\"}\n"
        "{\"messages\": [], \"answer\": \"1\"}\n"
        "{\"messages\": [{\"content\": \"no role\"}], \"answer\": \"1\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
        "{\"role\": \"user\", \"content\": \"b\"}], \"answer\": \"1\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  try {
    load_task_jsonl(path, {}, model);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("7 bad rows"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(path + ":1:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ":2: has both \"prompt\" and \"messages\""), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":3: missing field \"prompt\" (or \"messages\", a chat)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":4: \"messages\": 'messages' must be a list"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":5: \"messages\": 'messages' must not be empty"), std::string::npos)
        << msg;
    EXPECT_NE(
        msg.find(path + ":6: \"messages\": every message must be an object with a string 'role'"),
        std::string::npos)
        << msg;
    // The template's raise_exception, with its message.
    EXPECT_NE(msg.find(path + ":7: \"messages\": "), std::string::npos) << msg;
    EXPECT_NE(msg.find("Conversation roles must alternate user/assistant"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(path + ":8: missing field \"answer\""), std::string::npos) << msg;
  }
  // No model directory, or one whose template does not parse: named with the first chat row.
  ASSERT_THROWS_WITH(load_task_jsonl(path, {}, ""), std::invalid_argument,
                     path + ":1: a \"messages\" row needs the model's chat template");
  const std::string broken = test::test_model_with_tokenizer_config(
      dir.file("broken"), R"({"chat_template": "ok\n{% if %}"})");
  ASSERT_THROWS_WITH(load_task_jsonl(path, {}, broken), std::invalid_argument,
                     path + ":1: \"messages\" rows need the chat template of " + broken);
}

TEST(TaskTest, EvalSplitIsHeldOutAndSeeded) {
  auto rows = default_task_rows(100, 3);
  auto a = split_task(rows, 20, 9);
  auto b = split_task(rows, 20, 9);
  ASSERT_EQ(a.eval.size(), 20u);
  // The default task repeats word lists: rows with a held-out prompt are not trained on.
  EXPECT_GT(a.dropped_train_rows, 0);
  ASSERT_EQ(a.train.size() + a.dropped_train_rows, 80u);
  for (const auto& t : a.train) {
    for (const auto& e : a.eval) EXPECT_NE(t.prompt, e.prompt);
  }
  for (size_t i = 0; i < a.eval.size(); ++i) EXPECT_EQ(a.eval[i].prompt, b.eval[i].prompt);
  ASSERT_THROWS_WITH(
      split_task(rows, 60, 1), std::invalid_argument,
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
  text::Tokenizer tok(engine::ensure_default_tokenizer());
  auto rows = default_task_rows(200, 1);
  std::set<std::string> distinct;
  for (const auto& r : rows) {
    distinct.insert(r.prompt);
    int64_t words = 1;
    for (char c : r.answer) words += c == ' ';
    EXPECT_EQ(static_cast<int64_t>(tok.encode(r.answer).size()), words) << r.answer;
    EXPECT_EQ(r.prompt.rfind("Copy: " + r.answer + ". Answer:", 0), 0u) << r.prompt;
    EXPECT_EQ(tok.decode(tok.encode(r.answer)), r.answer);
    EXPECT_TRUE(words == 2 || words == 3) << r.answer;
  }
  EXPECT_GT(distinct.size(), 150u);
}

// The warm-up's demonstrations are the answer's words in a random order: the format (which words,
// how many) without the order, which GRPO learns from the reward. Every order turns up.
TEST(TaskTest, DefaultTaskDemonstrationsShuffleTheAnswersWords) {
  auto rows = default_task_rows(2000, 5);
  auto words_of = [](const std::string& s) {
    std::vector<std::string> w;
    std::istringstream in(s);
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  int64_t in_order = 0, three_distinct = 0;
  std::set<std::vector<std::string>> orders_of_abc;
  for (const auto& r : rows) {
    auto a = words_of(r.answer), d = words_of(r.demonstration);
    ASSERT_EQ(a.size(), d.size()) << r.answer << " / " << r.demonstration;
    std::vector<std::string> sa = a, sd = d;
    std::sort(sa.begin(), sa.end());
    std::sort(sd.begin(), sd.end());
    EXPECT_EQ(sa, sd) << r.answer << " / " << r.demonstration;
    if (a.size() == 3 && std::set<std::string>(a.begin(), a.end()).size() == 3) {
      ++three_distinct;
      in_order += a == d;
      std::vector<std::string> order;  // d in terms of a's positions
      for (const auto& w : d)
        order.push_back(std::to_string(std::find(a.begin(), a.end(), w) - a.begin()));
      orders_of_abc.insert(order);
    }
  }
  EXPECT_EQ(orders_of_abc.size(), 6u);  // all 3! orders
  // About 1 in 6 three-word demonstrations happens to be in order (binomial sd ~ 0.012 here).
  const double share = static_cast<double>(in_order) / static_cast<double>(three_distinct);
  EXPECT_GT(share, 0.10);
  EXPECT_LT(share, 0.24);
  // Same seed, same rows and demonstrations.
  EXPECT_EQ(default_task_rows(50, 5)[7].demonstration, rows[7].demonstration);
}

}  // namespace
}  // namespace crl::trainer

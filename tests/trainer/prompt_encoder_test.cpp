#include "trainer/prompt_encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/test_utils.h"
#include "text/chat_template.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

// Mistral-7B-Instruct-v0.1's template (tests/fixtures/chat_templates): writes {{ bos_token }},
// and eos_token after each assistant turn.
const char kMistralTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

const char kChat[] =
    R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"},)"
    R"( {"role": "user", "content": "2+2?"}])";

std::vector<TaskRow> load_rows(const test::TempDir& dir, const std::string& model_dir) {
  const std::string path = dir.file("data.jsonl");
  std::ofstream(path) << ojson({{"prompt", "Copy: red tree. Answer:"}, {"answer", "red tree"}})
                      << "\n"
                      << ojson({{"messages", ojson::parse(kChat)}, {"answer", "4"}}) << "\n";
  return load_task_jsonl(path, {}, model_dir);
}

engine::EngineConfig config_for(const std::string& model_dir) {
  engine::EngineConfig c = test::test_engine_config("llama");
  c.model_dir = model_dir;
  return c;
}

TEST(PromptEncoderTest, MessagesRowGetsTheIdsOfItsTemplateRenderWithTheTemplatesBosOnly) {
  test::TempDir dir;
  const ojson config = {{"chat_template", kMistralTemplate},
                        {"bos_token", "<s>"},
                        {"eos_token", "</s>"},
                        {"add_bos_token", true}};
  const std::string model =
      test::test_model_with_tokenizer_config(dir.file("model"), config.dump());
  const std::vector<TaskRow> rows = load_rows(dir, model);
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_EQ(rows[1].kind, PromptKind::kChat);
  ASSERT_EQ(rows[1].prompt, "<s>[INST] hi [/INST]ho</s> [INST] 2+2? [/INST]");

  engine::LlmEngine eng(config_for(model));
  const text::Tokenizer& tok = *eng.tokenizer();
  ASSERT_EQ(eng.prompt_prefix(), std::vector<int32_t>{tok.bos_id()});  // text prompts get BOS
  const PromptEncoder prompts(tok, eng.prompt_prefix());
  // A text row: exactly what the engine makes of the text.
  EXPECT_EQ(prompts.encode(rows[0]), eng.encode_prompt(rows[0].prompt));
  // The chat row: the template's <s> and </s> as their ids, no second BOS.
  std::vector<int32_t> expected = {tok.bos_id()};
  for (int32_t id : tok.encode("[INST] hi [/INST]ho")) expected.push_back(id);
  expected.push_back(tok.eos_id());
  for (int32_t id : tok.encode(" [INST] 2+2? [/INST]")) expected.push_back(id);
  EXPECT_EQ(prompts.encode(rows[1]), expected);
}

// --split-special-tokens: a literal in a message stays text; the template's own are tokens.
TEST(PromptEncoderTest, UntrustedMessagesKeepTheirSpecialTokenLiteralsAsText) {
  test::TempDir dir;
  const ojson config = {{"chat_template", kMistralTemplate},
                        {"bos_token", "<s>"},
                        {"eos_token", "</s>"},
                        {"add_bos_token", true}};
  const std::string model =
      test::test_model_with_tokenizer_config(dir.file("model"), config.dump());
  const std::string path = dir.file("data.jsonl");
  const ojson chat = ojson::parse(
      R"([{"role": "user", "content": "hi</s><s>"}, {"role": "assistant", "content": "ho"},)"
      R"( {"role": "user", "content": "2+2? </s>"}])");
  std::ofstream(path) << ojson({{"messages", chat}, {"answer", "4"}}) << "\n";
  const std::vector<TaskRow> trusted = load_task_jsonl(path, {}, model);
  const std::vector<TaskRow> untrusted =
      load_task_jsonl(path, {}, model, /*split_special_tokens=*/true);
  ASSERT_EQ(untrusted.size(), 1u);
  EXPECT_EQ(untrusted[0].prompt, trusted[0].prompt);  // the same text; the literals' places known
  EXPECT_EQ(untrusted[0].prompt, "<s>[INST] hi</s><s> [/INST]ho</s> [INST] 2+2? </s> [/INST]");
  EXPECT_EQ(untrusted[0].literal_spans.size(), 3u);

  engine::LlmEngine eng(config_for(model));
  const text::Tokenizer& tok = *eng.tokenizer();
  const PromptEncoder prompts(tok, eng.prompt_prefix());
  std::vector<int32_t> expected = {tok.bos_id()};
  for (int32_t id : tok.encode("[INST] hi</s><s> [/INST]ho")) expected.push_back(id);
  expected.push_back(tok.eos_id());
  for (int32_t id : tok.encode(" [INST] 2+2? </s> [/INST]")) expected.push_back(id);
  EXPECT_EQ(prompts.encode(untrusted[0]), expected);
  const std::vector<int32_t> as_trusted = prompts.encode(trusted[0]);
  EXPECT_EQ(std::count(as_trusted.begin(), as_trusted.end(), tok.eos_id()), 3);
  EXPECT_EQ(std::count(expected.begin(), expected.end(), tok.eos_id()), 1);
}

TEST(PromptEncoderTest, BuiltinFormatRowGetsTheModelsBosInFront) {
  test::TempDir dir;
  const std::string model = test::test_model_dir("llama");  // carries no chat template
  const std::vector<TaskRow> rows = load_rows(dir, model);
  ASSERT_EQ(rows[1].kind, PromptKind::kBuiltinChat);
  engine::LlmEngine eng(config_for(model));
  const text::Tokenizer& tok = *eng.tokenizer();
  const PromptEncoder prompts(tok, eng.prompt_prefix());
  std::vector<int32_t> expected = eng.prompt_prefix();
  ASSERT_FALSE(expected.empty());
  for (int32_t id : text::ChatEncoder(tok).encode(rows[1].prompt)) expected.push_back(id);
  EXPECT_EQ(prompts.encode(rows[1]), expected);
}

}  // namespace
}  // namespace crl::trainer

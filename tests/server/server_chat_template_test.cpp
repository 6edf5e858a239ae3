// The chat endpoint with the model directory's own Jinja template (and a broken one).
#include <gtest/gtest.h>

#include <fstream>

#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"
#include "tests/test_utils.h"
#include "trainer/prompt_encoder.h"
#include "trainer/tasks.h"

namespace crl::test {
namespace {

using json = nlohmann::json;

std::string model_with_config(const TempDir& dir, const json& config) {
  return test_model_with_tokenizer_config(dir.path(), config.dump());
}

engine::EngineConfig config_for(const std::string& model_dir) {
  engine::EngineConfig c = test_engine_config("llama");
  c.model_dir = model_dir;
  return c;
}

TEST(ServerChatTemplateTest, ChatUsesTheModelsJinjaTemplateAndRequestFields) {
  TempDir dir;
  const json config = {
      {"chat_template",
       "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
       "{% if tools %}tools: {{ tools|map(attribute='function.name')|join(',') }}\n{% endif %}"
       "{% if add_generation_prompt %}assistant:{% if think is false %} no thinking{% endif %}{% "
       "endif %}"}};
  ServedModel served(config_for(model_with_config(dir, config)));
  EXPECT_EQ(served.server.chat_template().name(), "jinja");
  const json body = {{"messages", {{{"role", "user"}, {"content", "What is 3 plus 4?"}}}},
                     {"tools", {{{"type", "function"}, {"function", {{"name", "add"}}}}}},
                     {"chat_template_kwargs", {{"think", false}}}};
  auto [ts, tb] = served.post("/tokenize", body);
  ASSERT_EQ(ts, 200) << tb;
  engine::LlmEngine reference(config_for(dir.path()));
  // No BOS added by the server: the template decides what the prompt starts with.
  EXPECT_EQ(
      json::parse(tb)["tokens"].get<std::vector<int32_t>>(),
      reference.tokenizer()->encode("user: What is 3 plus 4?\ntools: add\nassistant: no thinking"));
  json chat = body;
  chat["max_tokens"] = 3;
  auto [cs, cb] = served.post("/v1/chat/completions", chat);
  ASSERT_EQ(cs, 200) << cb;
  json no_gen = body;
  no_gen["add_generation_prompt"] = false;
  no_gen["continue_final_message"] = true;
  auto [ns, nb] = served.post("/tokenize", no_gen);
  ASSERT_EQ(ns, 200) << nb;
  EXPECT_EQ(json::parse(nb)["tokens"].get<std::vector<int32_t>>(),
            reference.tokenizer()->encode("user: What is 3 plus 4?"));
}

TEST(ServerChatTemplateTest, TemplateThatWritesBosAndEosGetsTheirIdsOnce) {
  TempDir dir;
  const json config = {{"bos_token", "<s>"},
                       {"eos_token", {{"content", "</s>"}, {"special", true}}},
                       {"chat_template",
                        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
                        "{{ eos_token if m.role == 'assistant' }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}"}};
  ServedModel served(config_for(model_with_config(dir, config)));
  const json body = {{"messages",
                      {{{"role", "user"}, {"content", "hi"}},
                       {{"role", "assistant"}, {"content", "ho"}},
                       {{"role", "user"}, {"content", "2+2?"}}}}};
  auto [ts, tb] = served.post("/tokenize", body);
  ASSERT_EQ(ts, 200) << tb;
  engine::LlmEngine reference(config_for(dir.path()));
  const text::Tokenizer& tok = *reference.tokenizer();
  std::vector<int32_t> expected = {tok.bos_id()};  // written by the template, not added again
  for (int32_t id : tok.encode("user: hi\nassistant: ho")) expected.push_back(id);
  expected.push_back(tok.eos_id());
  for (int32_t id : tok.encode("\nuser: 2+2?\nassistant:")) expected.push_back(id);
  EXPECT_EQ(json::parse(tb)["tokens"].get<std::vector<int32_t>>(), expected);
}

TEST(ServerChatTemplateTest, ChatEndpointAndMessagesDataRowsGiveAChatTheSameIds) {
  TempDir dir;
  const json config = {{"bos_token", "<s>"},
                       {"eos_token", "</s>"},
                       {"chat_template",
                        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                        "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}"}};
  const std::string model = model_with_config(dir, config);
  const json messages = json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"},
      {"role": "user", "content": "2+2?"}])");
  std::ofstream(dir.file("data.jsonl")) << json({{"messages", messages}, {"answer", "4"}}) << "\n";
  const auto rows = trainer::load_task_jsonl(dir.file("data.jsonl"), {}, model);
  ASSERT_EQ(rows.size(), 1u);

  ServedModel served(config_for(model));
  auto [ts, tb] = served.post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(ts, 200) << tb;
  engine::LlmEngine eng(config_for(model));  // the RL job's infer rank builds its encoder so
  const trainer::PromptEncoder prompts(*eng.tokenizer(), eng.prompt_prefix());
  EXPECT_EQ(prompts.encode(rows[0]), json::parse(tb)["tokens"].get<std::vector<int32_t>>());
}

// Hostile templates from a model directory (issue 49): 10,000 nested parentheses used to end the
// process at start (stack overflow) and nested loops kept a core busy for hours. Now the server
// starts, chat requests get a 400 chat_template_error, and it keeps serving.
TEST(ServerChatTemplateTest, HostileTemplatesGive400AndTheServerKeepsServing) {
  const std::string deep = "{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}";
  const std::string loops =
      "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}";
  for (const std::string& tmpl : {deep, loops}) {
    TempDir dir;
    ServedModel served(config_for(model_with_config(dir, {{"chat_template", tmpl}})));
    auto [cs, cb] =
        served.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
    EXPECT_EQ(cs, 400) << cb;
    EXPECT_EQ(json::parse(cb)["error"]["code"], "chat_template_error") << cb;
    auto [ps, pb] = served.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    EXPECT_EQ(ps, 200) << pb;
  }
}

TEST(ServerChatTemplateTest, BrokenTemplateGives400NamingTheLineWhileCompletionsWork) {
  TempDir dir;
  ServedModel served(
      config_for(model_with_config(dir, {{"chat_template", "ok\n{{ messages | nosuch }}"}})));
  EXPECT_NE(served.server.chat_template_error().find("line 2: unknown filter 'nosuch'"),
            std::string::npos)
      << served.server.chat_template_error();
  auto [cs, cb] =
      served.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(cs, 400);
  const json error = json::parse(cb)["error"];
  EXPECT_EQ(error["code"], "chat_template_error");
  EXPECT_NE(
      error["message"].get<std::string>().find("tokenizer_config.json: chat_template' line 2"),
      std::string::npos)
      << cb;
  auto [ps, pb] = served.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(ps, 200) << pb;
}

TEST(ServerChatTemplateTest, TemplateRaiseExceptionIs400) {
  TempDir dir;
  const json config = {{"chat_template",
                        "{% if messages[0].role != 'system' %}{{ raise_exception('System message "
                        "first!') }}{% endif %}x"}};
  ServedModel served(config_for(model_with_config(dir, config)));
  auto [cs, cb] =
      served.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(cs, 400) << cb;
  EXPECT_NE(cb.find("System message first!"), std::string::npos) << cb;
}

}  // namespace
}  // namespace crl::test

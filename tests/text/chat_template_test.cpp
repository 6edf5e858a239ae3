#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/test_utils.h"
#include "text/jinja/template.h"

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kMessages = ojson::parse(R"([{"role": "user", "content": "Hi"}])");

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ChatTemplateTest, DirectoryWithoutTemplateUsesThePlainBuiltin) {
  test::TempDir dir;
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).name(), "plain");
  write(dir.file("tokenizer_config.json"), R"({"bos_token": "<s>"})");
  const ChatTemplate chat = ChatTemplate::from_model_dir(dir.path());
  EXPECT_FALSE(chat.is_jinja());
  EXPECT_EQ(chat.render(kMessages), "User: Hi\nAssistant:");
}

TEST(ChatTemplateTest, RendersTheConfigTemplateWithAddedTokenForms) {
  test::TempDir dir;
  write(dir.file("tokenizer_config.json"), R"({
    "bos_token": {"__type": "AddedToken", "content": "<B>", "lstrip": false},
    "eos_token": "<E>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ greeting | default('') }}"})");
  const ChatTemplate chat = ChatTemplate::from_model_dir(dir.path());
  ASSERT_TRUE(chat.is_jinja());
  EXPECT_EQ(chat.name(), "jinja");
  EXPECT_EQ(chat.render(kMessages), "<B>[user]Hi<E>[assistant]");
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  options.kwargs = {{"greeting", "!"}};
  EXPECT_EQ(chat.render(kMessages, options), "<B>[user]Hi<E>!");
}

TEST(ChatTemplateTest, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  const ChatTemplate chat = ChatTemplate::from_tokenizer_config(ojson::parse(R"({"chat_template": [
      {"name": "default", "template": "default"}, {"name": "tool_use", "template": "tools={{ tools|length }}"}]})"),
                                                                "cfg");
  EXPECT_EQ(chat.render(kMessages), "default");
  ChatRenderOptions options;
  options.tools = ojson::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(chat.render(kMessages, options), "tools=1");
}

TEST(ChatTemplateTest, PrefersChatTemplateJinjaFile) {
  test::TempDir dir;
  write(dir.file("tokenizer_config.json"), R"({"chat_template": "from config"})");
  write(dir.file("chat_template.jinja"), "from file\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).render(kMessages), "from file");
}

TEST(ChatTemplateTest, ContinueFinalMessageCutsAfterTheLastMessage) {
  const ChatTemplate chat = ChatTemplate::from_jinja(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}");
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  options.continue_final_message = true;
  const ojson messages = ojson::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}])");
  EXPECT_EQ(chat.render(messages, options), "<user>Hi</user><assistant>The answer is");
  options.add_generation_prompt = true;
  ASSERT_THROWS_WITH(chat.render(messages, options), std::invalid_argument, "cannot both be true");
}

TEST(ChatTemplateTest, MalformedConfigsNameTheFileAndJsonPath) {
  test::TempDir dir;
  const std::string config = dir.file("tokenizer_config.json");
  write(config, "{not json");
  ASSERT_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()), std::invalid_argument,
                     config + ": invalid JSON");
  write(config, R"({"chat_template": 3})");
  ASSERT_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()), std::invalid_argument,
                     config + ": chat_template must be a string or a list");
  write(config,
        R"({"chat_template": [{"name": "default", "template": "x"}, {"name": "tool_use"}]})");
  ASSERT_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()), std::invalid_argument,
                     config + ": chat_template[1]");
  write(config, R"({"bos_token": 5, "chat_template": "x"})");
  ASSERT_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()), std::invalid_argument,
                     "'bos_token'");
  write(config, R"({"chat_template": "line 1\n{{ messages | frobnicate }}"})");
  ASSERT_THROWS_WITH(
      ChatTemplate::from_model_dir(dir.path()), jinja::TemplateError,
      "template '" + config + ": chat_template' line 2: unknown filter 'frobnicate'");
  write(config, R"({"chat_template": [{"name": "default", "template": "{% include 'x' %}"}]})");
  ASSERT_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()), jinja::TemplateError,
                     "chat_template[0] (default)' line 1: unsupported tag 'include'");
}

TEST(ChatTemplateTest, BadMessagesAndOptionsAreInvalidArguments) {
  const ChatTemplate chat = ChatTemplate::from_jinja("{{ messages|length }}");
  ASSERT_THROWS_WITH(chat.render(ojson::array()), std::invalid_argument, "must not be empty");
  ASSERT_THROWS_WITH(chat.render(ojson::parse(R"([{"content": "x"}])")), std::invalid_argument,
                     "'role'");
  ChatRenderOptions options;
  options.kwargs = {{"messages", 1}};
  ASSERT_THROWS_WITH(chat.render(kMessages, options), std::invalid_argument,
                     "cannot set 'messages'");
}

}  // namespace
}  // namespace crl::text

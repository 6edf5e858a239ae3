// Tool-call parsing (issue 28): the Hermes/Qwen and Llama-3.1 JSON forms, the format each real
// template of tests/fixtures/chat_templates prints, and bad calls as errors, never exceptions.
#include "text/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

ChatTemplate fixture_template(const std::string& name) {
  std::ifstream in(std::string(CRL_FIXTURES_DIR) + "/chat_templates/templates.json");
  const ojson all = ojson::parse(in);
  for (const auto& t : all) {
    if (t["name"] == name) {
      ojson config = {{"chat_template", t["template"]},
                      {"bos_token", t["bos_token"]},
                      {"eos_token", t["eos_token"]}};
      return ChatTemplate::from_tokenizer_config(config, name);
    }
  }
  throw std::runtime_error("no template " + name);
}

TEST(ToolCallsTest, HermesCallsAndContent) {
  auto r =
      parse_tool_calls(ToolCallFormat::kHermes,
                       "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 12, "
                       "\"b\": 30}}\n</tool_call>\n<tool_call>{\"name\": \"neg\", \"arguments\": "
                       "\"{\\\"x\\\": 1}\"}</tool_call>");
  EXPECT_EQ(r.content, "Let me add.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.calls[0].name, "add");
  EXPECT_EQ(r.calls[0].arguments, ojson({{"a", 12}, {"b", 30}}));
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[1].name, "neg");  // arguments given as a JSON string
  EXPECT_EQ(r.calls[1].arguments, ojson({{"x", 1}}));
  ojson m = r.message();
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["tool_calls"][1]["function"]["name"], "neg");
}

TEST(ToolCallsTest, HermesPlainAnswerHasNoCalls) {
  auto r = parse_tool_calls(ToolCallFormat::kHermes, "  42\n");
  EXPECT_EQ(r.content, "42");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_TRUE(r.errors.empty());
  EXPECT_FALSE(r.message().contains("tool_calls"));
}

TEST(ToolCallsTest, BadHermesCallsAreErrorsNotExceptions) {
  const char* bad[] = {
      "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1</tool_call>",  // bad JSON
      "<tool_call>[1, 2]</tool_call>",                                        // not an object
      "<tool_call>{\"arguments\": {}}</tool_call>",                           // no name
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",         // args not object
      "<tool_call>{\"name\": \"f\", \"arguments\": \"nope\"}</tool_call>",  // args string not JSON
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}",                    // unterminated
      "<tool_call>",
      "<tool_call>\xff\xfe</tool_call>",
  };
  for (const char* text : bad) {
    ParsedReply r;
    ASSERT_NO_THROW(r = parse_tool_calls(ToolCallFormat::kHermes, text)) << text;
    EXPECT_TRUE(r.calls.empty()) << text;
    ASSERT_EQ(r.errors.size(), 1u) << text;
    EXPECT_NE(r.errors[0].find("tool call"), std::string::npos) << r.errors[0];
  }
  // An error's excerpt of the call is cut at a character boundary: the tool message that carries
  // it back to the model stays valid UTF-8 (a strict JSON dump of it does not throw).
  for (size_t pad = 74; pad <= 78; ++pad) {
    const std::string call =
        "<tool_call>" + std::string(pad, 'x') + "\xc3\xa9" + std::string(10, 'y') + "</tool_call>";
    ParsedReply bad_utf8 = parse_tool_calls(ToolCallFormat::kHermes, call);
    ASSERT_EQ(bad_utf8.errors.size(), 1u);
    EXPECT_NO_THROW((void)ojson(bad_utf8.errors[0]).dump()) << pad;
  }
  // One good and one bad call: the good one is kept.
  auto r = parse_tool_calls(ToolCallFormat::kHermes,
                            "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{x}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, ojson::object());
  EXPECT_EQ(r.errors.size(), 1u);
}

TEST(ToolCallsTest, Llama3JsonCalls) {
  auto r =
      parse_tool_calls(ToolCallFormat::kLlama3Json,
                       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris; FR\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments["city"], "Paris; FR");  // ';' inside a string does not split
  EXPECT_EQ(r.content, "");
  r = parse_tool_calls(ToolCallFormat::kLlama3Json,
                       "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
                       "\"arguments\": {\"x\": 2}}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].id, "call_1");
  r = parse_tool_calls(ToolCallFormat::kLlama3Json, "The answer is 42.");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.content, "The answer is 42.");
  r = parse_tool_calls(ToolCallFormat::kLlama3Json, "{\"name\": \"a\", \"parameters\": ");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.errors.size(), 1u);
  r = parse_tool_calls(ToolCallFormat::kLlama3Json, "<|python_tag|>");
  EXPECT_EQ(r.errors.size(), 1u);
}

TEST(ToolCallsTest, FormatThenParseRoundTrips) {
  ToolCall c;
  c.name = "calc";
  c.arguments = {{"a", "4821"}, {"b", 7393}};
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    auto r = parse_tool_calls(f, format_tool_call(f, c));
    ASSERT_EQ(r.calls.size(), 1u) << tool_call_format_name(f);
    EXPECT_EQ(r.calls[0].name, "calc");
    EXPECT_EQ(r.calls[0].arguments, c.arguments);
    EXPECT_EQ(parse_tool_call_format(tool_call_format_name(f)), f);
  }
  EXPECT_THROW(parse_tool_call_format("mistral"), std::invalid_argument);
  EXPECT_EQ(tool_call_stop_strings(ToolCallFormat::kHermes),
            std::vector<std::string>{"</tool_call>"});
  EXPECT_TRUE(tool_call_stop_strings(ToolCallFormat::kLlama3Json).empty());
}

TEST(ToolCallsTest, FormatIsChosenFromTheModelsTemplate) {
  EXPECT_EQ(detect_tool_call_format(fixture_template("Qwen2.5-7B-Instruct")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(fixture_template("Qwen3")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(fixture_template("Hermes-2-Pro-Llama-3-8B")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(fixture_template("Llama-3.1-8B-Instruct")),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format(fixture_template("Llama-3.2-3B-Instruct")),
            ToolCallFormat::kLlama3Json);
  // No tool-call syntax in the template (or no template): Hermes.
  EXPECT_EQ(detect_tool_call_format(fixture_template("SmolLM2-Instruct")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(ChatTemplate()), ToolCallFormat::kHermes);
}

}  // namespace
}  // namespace crl::text

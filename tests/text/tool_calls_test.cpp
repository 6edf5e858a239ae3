// Tool-call parsing (issue 28): the Hermes/Qwen and Llama-3.1 JSON forms, the format each real
// template of tests/fixtures/chat_templates prints, and bad calls as errors, never exceptions.
#include "text/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/test_utils.h"
#include "text/tokenizer.h"

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

namespace crl::text {
namespace {

// Hermes markers that a tokenizer marks special (issue 52): Qwen's tokenizer with <tool_call> and
// </tool_call> flagged special, as some Hermes-family tokenizers ship them. Text decoded with
// special tokens skipped drops them, so the runner stops on the closing marker's id and decodes
// the reply keeping the markers (and dropping the other special tokens).
TEST(ToolCallsSpecialMarkersTest, SpecialMarkersStopByIdAndSurviveTheDecode) {
  if (!test::tokenizer_fixtures_error().empty()) GTEST_SKIP() << test::tokenizer_fixtures_error();
  const std::string source = test::tokenizer_fixtures_dir() + "/qwen3/tokenizer.json";
  std::ifstream in(source);
  ojson config = ojson::parse(in);
  for (auto& t : config["added_tokens"]) {
    if (t["content"] == "<tool_call>" || t["content"] == "</tool_call>") t["special"] = true;
  }
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << config.dump();
  const Tokenizer special(path);
  const Tokenizer plain(source);

  const ToolCallMarkers m = special_tool_call_markers(special, ToolCallFormat::kHermes);
  ASSERT_EQ(m.ids.size(), 2u);
  ASSERT_TRUE(m.close_id.has_value());
  EXPECT_EQ(special.decode({*m.close_id}, false), "</tool_call>");
  // Not special, or not Hermes: nothing to do (the stop string and the plain decode see them).
  EXPECT_TRUE(special_tool_call_markers(plain, ToolCallFormat::kHermes).ids.empty());
  EXPECT_TRUE(special_tool_call_markers(special, ToolCallFormat::kLlama3Json).ids.empty());

  // A reply as the engine returns it: text, a call, the closing marker as the stop token.
  const std::string text =
      "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n"
      "</tool_call>";
  const std::vector<int32_t> ids = special.encode(text);
  ASSERT_EQ(ids.back(), *m.close_id);
  // Skipping special tokens loses the call ...
  EXPECT_TRUE(
      parse_tool_calls(ToolCallFormat::kHermes, special.decode_generated(ids)).calls.empty());
  // ... decode_reply keeps it, and drops another special token (an <|im_end|> after it).
  std::vector<int32_t> with_end = ids;
  with_end.push_back(special.encode("<|im_end|>").at(0));
  const std::string reply = decode_reply(special, m, with_end);
  EXPECT_EQ(reply, text);
  const ParsedReply parsed = parse_tool_calls(ToolCallFormat::kHermes, reply);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "add");
  EXPECT_EQ(parsed.content, "Let me add.");
}

}  // namespace
}  // namespace crl::text

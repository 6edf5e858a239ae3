#include "server/api_types.h"

#include <gtest/gtest.h>

#include "common/json_depth.h"
#include "text/chat_template.h"

namespace crl::server {
namespace {

TEST(ServerApiTypesTest, ParsesPromptFormsAndRejectsWrongTypes) {
  ApiLimits limits;
  text::ChatTemplate chat;
  auto parse = [&](const char* body) {
    return parse_completion_request(nlohmann::json::parse(body), Endpoint::kCompletions, limits,
                                    chat);
  };
  EXPECT_EQ(parse(R"({"prompt": "a"})").prompts.size(), 1u);
  EXPECT_EQ(parse(R"({"prompt": ["a", "b"]})").prompts.size(), 2u);
  auto ids = parse(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_FALSE(ids.prompts[0].is_text);
  EXPECT_EQ(parse(R"({"prompt": [[1], [2, 3]]})").prompts.size(), 2u);
  auto full = parse(R"({"prompt": "a", "n": 3, "max_tokens": 7, "temperature": 0.5, "top_k": -1,
                        "seed": 9, "stop": "x", "logprobs": 2, "stream": true,
                        "stream_options": {"include_usage": true}, "return_token_ids": true})");
  EXPECT_EQ(full.params.n, 3);
  EXPECT_EQ(full.params.max_tokens, 7);
  EXPECT_EQ(full.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*full.params.seed, 9u);
  EXPECT_EQ(full.params.logprobs, 2);
  EXPECT_TRUE(full.stream && full.include_usage && full.return_token_ids && full.logprobs);
  try {
    parse(R"({"prompt": "a", "top_p": "high"})");
    FAIL() << "expected ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "top_p");
  }
  EXPECT_EQ(param_from_message("invalid sampling parameter 'min_p': 2 (must be in [0, 1])"),
            "min_p");
}

// Nesting is bounded before nlohmann parses a body: the parse takes any depth, but copying the
// value (parse_messages copies each message's content) recursed once a level, and a 200 KB body of
// brackets overflowed the server thread's stack.
TEST(ServerApiTypesTest, DeeplyNestedBodiesAreRefusedBeforeTheyAreParsed) {
  const std::string deep = R"({"messages": [{"role": "user", "content": )" +
                           std::string(100000, '[') + std::string(100000, ']') + "}]}";
  try {
    parse_json_object(deep);
    FAIL() << "expected ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("deeper than 256 levels"), std::string::npos) << e.what();
  }
  // 256 levels parse; brackets inside strings, escaped quotes included, do not count.
  EXPECT_NO_THROW(
      parse_json_object("{\"a\": " + std::string(255, '[') + std::string(255, ']') + "}"));
  EXPECT_THROW(parse_json_object("{\"a\": " + std::string(256, '[') + std::string(256, ']') + "}"),
               ApiError);
  EXPECT_FALSE(json_too_deep(R"(["[[[", "\"[[[", {"k]": "{{{"}])", 2));
  EXPECT_TRUE(json_too_deep(R"(["\\", [[]]])", 2));  // an escaped backslash, then the string's end
}

TEST(ServerApiTypesTest, ChatFieldsReachTheModelTemplate) {
  const text::ChatTemplate chat = text::ChatTemplate::from_jinja(
      "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %} call {{ "
      "m.tool_calls[0].function.name }}"
      "{{ m.tool_calls[0].function.arguments|tojson }}{% endif %}{% if m.tool_call_id %} id={{ "
      "m.tool_call_id }}{% endif %}"
      "{% if m.reasoning_content %} think={{ m.reasoning_content }}{% endif %};{% endfor %}"
      "{% if tools %}tools={{ tools|tojson }};{% endif %}"
      "{% if add_generation_prompt %}GEN{% if enable_thinking is false %} nothink{% endif %}{% "
      "endif %}");
  auto render = [&](const char* body) {
    return render_chat(chat, nlohmann::ordered_json::parse(body));
  };
  EXPECT_EQ(render(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                  {"type": "text", "text": "b"}]}]})"),
            "user:a\nb;GEN");
  EXPECT_EQ(
      render(R"({"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": false,
                       "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}]})"),
      "user:q;tools=[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": "
      "\"d\"}}];");
  EXPECT_EQ(render(R"({"messages": [{"role": "assistant", "content": null, "reasoning_content": "r",
                        "tool_calls": [{"id": "c1", "type": "function",
                                        "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                       "chat_template_kwargs": {"enable_thinking": false}})"),
            "assistant:None call f{\"z\": 1, \"a\": [2]} think=r;tool:ok id=c1;GEN nothink");
  auto expect_400 = [&](const char* body, const std::string& part) {
    try {
      render(body);
      ADD_FAILURE() << "expected ApiError for " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_400(
      R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]})",
      "arguments is not valid JSON");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}})",
             "'tools' must be a list");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})",
             "must be a boolean");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})",
             "must be an object");
  expect_400(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
             "only text content parts");
  const text::ChatTemplate strict = text::ChatTemplate::from_jinja(
      "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}{{ "
      "messages[0].content + 1 }}");
  try {
    render_chat(strict, nlohmann::ordered_json::parse(
                            R"({"messages": [{"role": "user", "content": "x"}]})"));
    ADD_FAILURE() << "expected ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "chat_template_error");
    EXPECT_NE(std::string(e.what()).find("System first!"), std::string::npos) << e.what();
  }
  try {
    render_chat(strict, nlohmann::ordered_json::parse(
                            R"({"messages": [{"role": "system", "content": "x"}]})"));
    ADD_FAILURE() << "expected ApiError";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
}

TEST(ServerApiTypesTest, ModelSamplingDefaultsApplyOnlyWhereTheRequestGivesNone) {
  ApiLimits limits;
  limits.default_temperature = 0.6;  // as a generation_config.json sets them
  limits.default_top_p = 0.95;
  limits.default_top_k = 20;
  text::ChatTemplate chat;
  auto parse = [&](const char* body) {
    return parse_completion_request(nlohmann::json::parse(body), Endpoint::kCompletions, limits,
                                    chat);
  };
  auto d = parse(R"({"prompt": "a"})").params;
  EXPECT_DOUBLE_EQ(d.temperature, 0.6);
  EXPECT_DOUBLE_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.top_k, 20);
  auto own = parse(R"({"prompt": "a", "temperature": 0, "top_p": 1, "top_k": 0})").params;
  EXPECT_DOUBLE_EQ(own.temperature, 0.0);
  EXPECT_DOUBLE_EQ(own.top_p, 1.0);
  EXPECT_EQ(own.top_k, 0);
}

TEST(ServerApiTypesTest, BearerTokenMatchesOnlyTheExactKey) {
  using server::bearer_token_matches;
  EXPECT_TRUE(bearer_token_matches("Bearer k3y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer k3", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer k3yy", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer k3x", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Basic k3y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer ", ""));  // an empty key is no key
  EXPECT_FALSE(bearer_token_matches("", "k3y"));
  EXPECT_TRUE(bearer_token_matches("bearer k3y", "k3y"));  // the scheme in any case (RFC 7235)
  EXPECT_TRUE(bearer_token_matches("BeArEr k3y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer K3Y", "k3y"));  // the key exactly
}

}  // namespace
}  // namespace crl::server

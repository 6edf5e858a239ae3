// Where the server meets a vLLM user's expectations (issue 52): a field it knows but does not
// implement is a 400 naming it (never a silent 200 with different outputs), its no-op value is
// accepted, the penalties are taken; an unknown model is 404, a route asked with the wrong method
// 405 with Allow, and /version answers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"

namespace crl::test {
namespace {

using nlohmann::json;

TEST(ServerOpenAiCompatTest, UnimplementedFieldsAre400NamingThemAndTheirNoOpValuesPass) {
  server::ServerOptions o;
  o.version = "9.9.9 (commit abc)";
  ServedModel served(test_engine_config("llama"), o);
  struct Case {
    std::string path;
    json extra;
    std::string param;  // "" : accepted (200)
  };
  const std::vector<Case> cases = {
      {"/v1/completions", {{"best_of", 3}}, "best_of"},
      {"/v1/completions", {{"logit_bias", {{"5", 10}}}}, "logit_bias"},
      {"/v1/completions", {{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {"/v1/completions", {{"suffix", "!"}}, "suffix"},
      {"/v1/completions", {{"use_beam_search", true}}, "use_beam_search"},
      {"/v1/completions", {{"guided_json", {{"type", "object"}}}}, "guided_json"},
      {"/v1/chat/completions", {{"tool_choice", "required"}}, "tool_choice"},
      {"/v1/chat/completions", {{"parallel_tool_calls", false}}, "parallel_tool_calls"},
      // The no-op values a client library sends by default.
      {"/v1/completions",
       {{"frequency_penalty", 0},
        {"presence_penalty", 0.0},
        {"repetition_penalty", 1},
        {"best_of", 1},
        {"logit_bias", json::object()},
        {"user", "me"},
        {"suffix", ""},
        {"response_format", {{"type", "text"}}}},
       ""},
      {"/v1/chat/completions", {{"tool_choice", "auto"}, {"parallel_tool_calls", true}}, ""},
      {"/v1/completions", {{"best_of", 1}, {"n", nullptr}}, ""},  // n null: its default 1
      {"/v1/completions", {{"response_format", {{"type", 5}}}}, "response_format"},
      // The penalties are implemented (tests/engine/sampler_penalty_test.cpp).
      {"/v1/completions",
       {{"frequency_penalty", 0.5}, {"presence_penalty", -1}, {"repetition_penalty", 1.2}},
       ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.extra.dump());
    json body = c.extra;
    body["max_tokens"] = 2;
    if (c.path == "/v1/completions") {
      body["prompt"] = "hi";
    } else {
      body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
    }
    const auto [status, text] = served.post(c.path, body);
    if (c.param.empty()) {
      EXPECT_EQ(status, 200) << text;
      continue;
    }
    EXPECT_EQ(status, 400) << text;
    const json e = json::parse(text)["error"];
    EXPECT_EQ(e["param"], c.param) << text;
    EXPECT_EQ(e["code"], "unsupported_parameter") << text;
    EXPECT_NE(e["message"].get<std::string>().find("'" + c.param + "'"), std::string::npos);
  }
  // Penalties out of their range are a 400 naming them.
  for (const auto& [key, value] : std::vector<std::pair<std::string, double>>{
           {"frequency_penalty", 2.5}, {"presence_penalty", -3}, {"repetition_penalty", 0}}) {
    const auto [status, text] = served.post("/v1/completions", {{"prompt", "hi"}, {key, value}});
    EXPECT_EQ(status, 400) << text;
    EXPECT_EQ(json::parse(text)["error"]["param"], key) << text;
  }
}

TEST(ServerOpenAiCompatTest, StatusCodesAsVllmAndVersion) {
  server::ServerOptions o;
  o.version = "9.9.9 (commit abc)";
  ServedModel served(test_engine_config("llama"), o);
  auto c = served.client();
  auto unknown_model = served.post("/v1/completions", {{"prompt", "hi"}, {"model", "gpt-4"}});
  EXPECT_EQ(unknown_model.first, 404) << unknown_model.second;
  auto get_post_route = c->Get("/v1/completions");
  ASSERT_TRUE(get_post_route);
  EXPECT_EQ(get_post_route->status, 405);
  EXPECT_EQ(get_post_route->get_header_value("Allow"), "POST");
  EXPECT_EQ(json::parse(get_post_route->body)["error"]["message"], "method not allowed");
  auto post_get_route = served.post("/v1/models", json::object());
  EXPECT_EQ(post_get_route.first, 405);
  auto nothing = c->Get("/v1/nothing");
  ASSERT_TRUE(nothing);
  EXPECT_EQ(nothing->status, 404);
  auto version = c->Get("/version");
  ASSERT_TRUE(version);
  EXPECT_EQ(version->status, 200);
  EXPECT_EQ(json::parse(version->body)["version"], "9.9.9 (commit abc)");
}

}  // namespace
}  // namespace crl::test

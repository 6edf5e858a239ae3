// Chat sessions over HTTP (server/sessions.h): a turn's prompt ids are the session's ids (the
// earlier prompt, the sampled reply, then only the new text), served from the prefix cache; edits
// are refused, a retry rewinds, ended sessions say why.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/llm_engine.h"
#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"
#include "tests/test_utils.h"
#include "text/chat_encoder.h"

namespace crl::test {
namespace {

using json = nlohmann::json;

// "<s>user: hi\nassistant: ho</s>\nuser: ...": the reply closed by the EOS the model may sample.
const json kConfig = {{"bos_token", "<s>"},
                      {"eos_token", {{"content", "</s>"}, {"special", true}}},
                      {"chat_template",
                       "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
                       "{{ eos_token if m.role == 'assistant' }}\n{% endfor %}"
                       "{% if add_generation_prompt %}assistant:{% endif %}"}};

engine::EngineConfig config_for(const std::string& model_dir) {
  engine::EngineConfig c = test_engine_config("llama");
  c.model_dir = model_dir;
  return c;
}

json turn_body(const json& messages, const std::string& session) {
  return {{"messages", messages}, {"session_id", session}, {"max_tokens", 6},
          {"ignore_eos", true},   {"temperature", 0},      {"return_token_ids", true}};
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// One turn that must succeed: its response.
json post_turn(ServedModel& served, const json& messages, const std::string& session) {
  auto [status, body] = served.post("/v1/chat/completions", turn_body(messages, session));
  EXPECT_EQ(status, 200) << body;
  return json::parse(body);
}

class ServerSessionTest : public ::testing::Test {
 protected:
  TempDir dir_;
  std::string model_ = test_model_with_tokenizer_config(dir_.path(), kConfig.dump());
};

TEST_F(ServerSessionTest, EachTurnAppendsToTheSampledIdsAndHitsThePrefixCache) {
  ServedModel served(config_for(model_));
  engine::LlmEngine reference(config_for(model_));
  const text::ChatEncoder encoder(*reference.tokenizer());
  json messages = json::array({user("hi there")});
  std::vector<int32_t> held;
  for (int turn = 0; turn < 4; ++turn) {
    auto [status, body] = served.post("/v1/chat/completions", turn_body(messages, "s1"));
    ASSERT_EQ(status, 200) << body;
    const json r = json::parse(body);
    const auto prompt = r["prompt_token_ids"].get<std::vector<int32_t>>();
    const auto reply = r["choices"][0]["token_ids"].get<std::vector<int32_t>>();
    if (turn == 0) {
      EXPECT_EQ(prompt, encoder.encode("<s>user: hi there\nassistant:"));
      EXPECT_TRUE(r["session"]["created"].get<bool>());
    } else {
      // The earlier turns exactly as held, then the closer the model did not sample and the
      // new message: never a re-encoding of the reply's text.
      ASSERT_GE(prompt.size(), held.size());
      EXPECT_EQ(std::vector<int32_t>(prompt.begin(),
                                     prompt.begin() + static_cast<std::ptrdiff_t>(held.size())),
                held);
      std::vector<int32_t> tail(prompt.begin() + static_cast<std::ptrdiff_t>(held.size()),
                                prompt.end());
      EXPECT_EQ(tail,
                encoder.encode("</s>\nuser: " + messages.back()["content"].get<std::string>() +
                               "\nassistant:"));
      // Every held id the engine computed (all but the reply's last) came from the prefix cache,
      // the unfilled last block included.
      EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
                static_cast<int64_t>(held.size()) - 1)
          << "turn " << turn;
      EXPECT_FALSE(r["session"]["created"].get<bool>());
    }
    held = prompt;
    held.insert(held.end(), reply.begin(), reply.end());
    EXPECT_EQ(r["session"]["length"].get<size_t>(), held.size());
    EXPECT_EQ(r["session"]["segments"].get<int>(), 1);
    messages.push_back(r["choices"][0]["message"]);
    messages.push_back(user("and then " + std::to_string(turn)));
  }
}

TEST_F(ServerSessionTest, AnEditIsRefusedWith409AndARetryRewinds) {
  ServedModel served(config_for(model_));
  json messages = json::array({user("first")});
  auto [s1, b1] = served.post("/v1/chat/completions", turn_body(messages, "s2"));
  ASSERT_EQ(s1, 200) << b1;
  messages.push_back(json::parse(b1)["choices"][0]["message"]);
  messages.push_back(user("second"));
  auto [s2, b2] = served.post("/v1/chat/completions", turn_body(messages, "s2"));
  ASSERT_EQ(s2, 200) << b2;
  const json second = json::parse(b2);

  json edited = messages;
  edited[0]["content"] = "first, edited";
  edited.push_back(second["choices"][0]["message"]);
  edited.push_back(user("third"));
  auto res3 = served.client()->Post("/v1/chat/completions", turn_body(edited, "s2").dump(),
                                    "application/json");
  ASSERT_TRUE(res3);
  const std::string& b3 = res3->body;
  EXPECT_EQ(res3->status, 409) << b3;
  EXPECT_NE(b3.find("message 0 differs"), std::string::npos) << b3;
  EXPECT_NE(b3.find("session_conflict"), std::string::npos) << b3;
  // Not worth retrying as it is (OpenAI's SDKs retry a 409 without this header).
  EXPECT_EQ(res3->get_header_value("x-should-retry"), "false");

  // The last turn asked again, differently: it replaces the turn it retries.
  json retry = messages;
  retry.back() = user("second, asked again");
  auto [s4, b4] = served.post("/v1/chat/completions", turn_body(retry, "s2"));
  ASSERT_EQ(s4, 200) << b4;
  const json r4 = json::parse(b4);
  EXPECT_TRUE(r4["session"]["rewound"].get<bool>());
  engine::LlmEngine reference(config_for(model_));
  const text::ChatEncoder encoder(*reference.tokenizer());
  const json first = json::parse(b1);
  std::vector<int32_t> held = first["prompt_token_ids"].get<std::vector<int32_t>>();
  for (int32_t id : first["choices"][0]["token_ids"]) held.push_back(id);
  auto with = [&](const std::string& tail) {
    std::vector<int32_t> ids = held;
    for (int32_t id : encoder.encode(tail)) ids.push_back(id);
    return ids;
  };
  EXPECT_EQ(second["prompt_token_ids"].get<std::vector<int32_t>>(),
            with("</s>\nuser: second\nassistant:"));
  EXPECT_EQ(r4["prompt_token_ids"].get<std::vector<int32_t>>(),
            with("</s>\nuser: second, asked again\nassistant:"));
  EXPECT_EQ(r4["session"]["length"].get<size_t>(),
            r4["prompt_token_ids"].size() + r4["choices"][0]["token_ids"].size());
}

TEST_F(ServerSessionTest, BadSessionRequestsAre400) {
  ServedModel served(config_for(model_));
  json body = turn_body(json::array({user("x")}), "s3");
  body["n"] = 2;
  auto [s1, b1] = served.post("/v1/chat/completions", body);
  EXPECT_EQ(s1, 400) << b1;
  EXPECT_NE(b1.find("'n' must be 1"), std::string::npos) << b1;
  auto [s2, b2] =
      served.post("/v1/completions", {{"prompt", "x"}, {"session_id", "s3"}, {"max_tokens", 2}});
  EXPECT_EQ(s2, 400) << b2;
  EXPECT_NE(b2.find("sessions are for /v1/chat/completions"), std::string::npos) << b2;
  body = turn_body(json::array({user("x")}), "s3");
  body["session_id"] = 7;
  auto [s3, b3] = served.post("/v1/chat/completions", body);
  EXPECT_EQ(s3, 400) << b3;
  // Tools that differ from the session's first turn.
  auto [s4, b4] = served.post("/v1/chat/completions", turn_body(json::array({user("x")}), "s4"));
  ASSERT_EQ(s4, 200) << b4;
  json with_tools = turn_body(
      json::array({user("x"), json::parse(b4)["choices"][0]["message"], user("y")}), "s4");
  with_tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  auto [s5, b5] = served.post("/v1/chat/completions", with_tools);
  EXPECT_EQ(s5, 409) << b5;
  // The same tools with their keys in another order are the same tools.
  auto [s6, b6] = served.post_raw(
      "/v1/chat/completions",
      R"({"session_id": "s5", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
                                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})");
  ASSERT_EQ(s6, 200) << b6;
  const json reply = json::parse(b6)["choices"][0]["message"];
  auto [s7, b7] = served.post_raw(
      "/v1/chat/completions",
      R"({"session_id": "s5", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}, )" +
          reply.dump() +
          R"(, {"role": "user", "content": "y"}],
             "tools": [{"function": {"parameters": {"type": "object"}, "name": "f"}, "type": "function"}]})");
  EXPECT_EQ(s7, 200) << b7;
}

TEST_F(ServerSessionTest, ATurnPastTheSessionsTokenCapIs400) {
  server::ServerOptions options;
  options.sessions.max_tokens = 30;
  ServedModel served(config_for(model_), options);
  json messages = json::array({user("hello")});
  messages.push_back(post_turn(served, messages, "s6")["choices"][0]["message"]);
  messages.push_back(user("a longer question that brings the session past thirty tokens"));
  auto [s2, b2] = served.post("/v1/chat/completions", turn_body(messages, "s6"));
  EXPECT_EQ(s2, 400) << b2;
  EXPECT_NE(b2.find("over its cap of 30"), std::string::npos) << b2;
}

// A turn refused after it was made (its prompt and max_tokens past the context) changes nothing:
// the turn before it can still be retried; with no max_tokens the reply room stops at the
// session's cap; an edited reply is a 409, not a retry.
TEST_F(ServerSessionTest, ARefusedTurnLeavesTheSessionAndItsRetryPoint) {
  server::ServerOptions options;
  options.sessions.max_tokens = 200;
  ServedModel served(config_for(model_), options);
  json messages = json::array({user("first")});
  messages.push_back(post_turn(served, messages, "s8")["choices"][0]["message"]);
  messages.push_back(user("second"));
  const json second = post_turn(served, messages, "s8");
  json third = messages;
  third.push_back(second["choices"][0]["message"]);
  third.push_back(user("third"));
  json too_long = turn_body(third, "s8");
  too_long["max_tokens"] = 100000;
  auto [s3, b3] = served.post("/v1/chat/completions", too_long);
  ASSERT_EQ(s3, 400) << b3;
  json retry = messages;
  retry.back() = user("second, asked again");
  const json r4 = post_turn(served, retry, "s8");
  EXPECT_TRUE(r4["session"]["rewound"].get<bool>()) << r4;
  // The engine's reply edited: 409 naming it.
  json edited = retry;
  edited.push_back(r4["choices"][0]["message"]);
  edited.back()["content"] = "a reply the model never gave";
  edited.push_back(user("fourth"));
  auto [s5, b5] = served.post("/v1/chat/completions", turn_body(edited, "s8"));
  EXPECT_EQ(s5, 409) << b5;
  EXPECT_NE(b5.find("message 3 differs"), std::string::npos) << b5;
  // No max_tokens: the reply may take the rest of the cap, and the session ends within it.
  json open_ended = turn_body(edited, "s8");
  open_ended["messages"][3] = r4["choices"][0]["message"];
  open_ended.erase("max_tokens");
  auto [s6, b6] = served.post("/v1/chat/completions", open_ended);
  ASSERT_EQ(s6, 200) << b6;
  EXPECT_LE(json::parse(b6)["session"]["length"].get<int64_t>(), 200) << b6;
}

TEST_F(ServerSessionTest, AnIdleSessionEndsAndSaysSo) {
  server::ServerOptions options;
  options.sessions.idle_timeout_s = 0.2;
  ServedModel served(config_for(model_), options);
  json messages = json::array({user("hello")});
  auto [s1, b1] = served.post("/v1/chat/completions", turn_body(messages, "s5"));
  ASSERT_EQ(s1, 200) << b1;
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  messages.push_back(json::parse(b1)["choices"][0]["message"]);
  messages.push_back(user("still there?"));
  auto [s2, b2] = served.post("/v1/chat/completions", turn_body(messages, "s5"));
  EXPECT_EQ(s2, 410) << b2;
  EXPECT_NE(b2.find("expired after 0.2 s"), std::string::npos) << b2;
}

}  // namespace
}  // namespace crl::test

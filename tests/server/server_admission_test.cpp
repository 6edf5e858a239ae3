// Who gets served: the request queue's 429, --api-key, health before the model loads, and
// `serve --lora`'s adapters, over loopback with httplib::Client.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/model/lora.h"
#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"
#include "tests/test_utils.h"

namespace crl::test {
namespace {

using json = nlohmann::json;

TEST(ServerLimitsTest, QueueFullGets429WithRetryAfter) {
  server::ServerOptions o;
  o.max_concurrent_requests = 1;
  ServedModel served(server_test_config(), o);
  std::atomic<bool> started{false}, checked{false};
  // A stream holds the only slot: its client blocks in the receiver until the check is done.
  std::thread holder([&] {
    auto c = served.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "hold"}, {"max_tokens", 480}, {"ignore_eos", true}, {"stream", true}}
                   .dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      started = true;
      while (!checked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return false;
    };
    c->send(req);
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = served.client();
  auto res = c->Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(),
                     "application/json");
  checked = true;
  holder.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_TRUE(json::parse(res->body).contains("error"));
  EXPECT_TRUE(served.wait_idle(5));
  // The slot is free again.
  auto ok = c->Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(),
                    "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// --api-key: every endpoint but /health and /metrics needs "Authorization: Bearer KEY" (the
// scheme in any case); a missing or wrong key is a 401 OpenAI error, whatever the endpoint or body.
TEST(ServerAuthTest, ApiKeyGuardsEveryEndpointButHealthAndMetrics) {
  server::ServerOptions o;
  o.api_key = "sk-local-7f3a";
  ServedModel served(server_test_config(), o);
  auto c = served.client();
  const std::string completion = json{{"prompt", "x"}, {"max_tokens", 2}}.dump();
  auto expect_401 = [](const httplib::Result& r, const std::string& what) {
    ASSERT_TRUE(r) << what;
    EXPECT_EQ(r->status, 401) << what << ": " << r->body;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer") << what;
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["code"], "invalid_api_key") << what;
    EXPECT_EQ(e["type"], "invalid_request_error") << what;
  };
  expect_401(c->Post("/v1/completions", completion, "application/json"), "no key");
  for (const std::string bad :
       {"Bearer sk-local-7f3", "Bearer sk-local-7f3ab", "Bearer sk-local-7f3b",
        "Bearer SK-LOCAL-7F3A", "sk-local-7f3a", "Bearer  sk-local-7f3a", ""}) {
    expect_401(c->Post("/v1/completions", {{"Authorization", bad}}, completion, "application/json"),
               "header '" + bad + "'");
  }
  expect_401(c->Post("/v1/chat/completions", R"({"messages": [})", "application/json"), "chat");
  expect_401(c->Post("/pause", "", "application/json"), "pause");
  expect_401(c->Post("/detokenize", R"({"tokens": [1]})", "application/json"), "detokenize");
  expect_401(c->Get("/v1/models"), "models");
  EXPECT_FALSE(served.server.engine_loop().paused());  // the refused /pause did nothing

  auto h = c->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("crl:http_responses_total{code=\"401\"}"), std::string::npos) << m->body;

  const httplib::Headers key = {{"Authorization", "Bearer sk-local-7f3a"}};
  auto ok = c->Post("/v1/completions", key, completion, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  // The scheme is case-insensitive (RFC 7235), the key is not (above).
  for (const std::string scheme : {"bearer", "BEARER"}) {
    auto lower = c->Post("/v1/completions", {{"Authorization", scheme + " sk-local-7f3a"}},
                         completion, "application/json");
    ASSERT_TRUE(lower);
    EXPECT_EQ(lower->status, 200) << scheme << ": " << lower->body;
  }
  auto t = c->Post("/tokenize", key, R"({"prompt": "hello"})", "application/json");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->status, 200) << t->body;
  auto models = c->Get("/v1/models", key);
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);

  // --api-key-everywhere closes /health and /metrics too.
  o.key_for_health_and_metrics = true;
  ServedModel closed(server_test_config(), o);
  auto c2 = closed.client();
  expect_401(c2->Get("/health"), "closed health");
  expect_401(c2->Get("/metrics"), "closed metrics");
  auto h2 = c2->Get("/health", key);
  ASSERT_TRUE(h2);
  EXPECT_EQ(h2->status, 200);
}

TEST(ServerLimitsTest, HealthIs503UntilTheModelLoadsAndWhenItFails) {
  engine::EngineConfig bad = server_test_config();
  bad.model_dir = "/nonexistent/model";
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  server::Server srv(bad, o);
  const int port = srv.start();
  httplib::Client c("127.0.0.1", port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_THROW(srv.engine_loop().wait_ready(), std::runtime_error);
  h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(json::parse(h->body)["status"], "error");
  auto r = c.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  srv.stop();
}

// `serve --lora NAME=DIR`: a request's "model" picks the adapter (vLLM's convention), /v1/models
// lists it under the base, and its tokens are an engine's with that adapter.
TEST(ServerLoraTest, RequestsPickAnAdapterByTheirModelField) {
  TempDir tmp;
  engine::EngineConfig cfg = server_test_config();
  {
    engine::LlmEngine probe(cfg);
    engine::save_peft_adapter(
        engine::make_lora_adapter(probe.model_config(), 4, 8,
                                  engine::parse_lora_targets("all-linear"), 17, true),
        tmp.file("sql"));
  }
  cfg.lora_modules = {{"sql", tmp.file("sql")}};
  server::ServerOptions o;
  o.served_model_name = "tiny";
  ServedModel served(cfg, o);
  engine::LlmEngine reference(cfg);

  auto c = served.client();
  auto models = c->Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  ASSERT_EQ(m["data"].size(), 2u) << models->body;
  EXPECT_EQ(m["data"][1]["id"], "sql");
  EXPECT_EQ(m["data"][1]["parent"], "tiny");

  const std::vector<int32_t> prompt = {5, 17, 99, 200, 31, 8};
  std::vector<std::vector<int32_t>> got;
  for (const std::string model : {"sql", "tiny"}) {
    SCOPED_TRACE(model);
    auto [status, text] = served.post("/v1/completions", {{"model", model},
                                                          {"prompt", prompt},
                                                          {"max_tokens", 12},
                                                          {"temperature", 0},
                                                          {"return_token_ids", true}});
    ASSERT_EQ(status, 200) << text;
    const json r = json::parse(text);
    EXPECT_EQ(r["model"], model);
    engine::GenerateRequest ref;
    ref.prompt_token_ids = prompt;
    ref.params.max_tokens = 12;
    ref.params.temperature = 0;
    ref.lora = model == "sql" ? "sql" : "";
    EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              reference.generate({ref}).at(0).outputs[0].token_ids);
    got.push_back(r["choices"][0]["token_ids"].get<std::vector<int32_t>>());
  }
  EXPECT_NE(got[0], got[1]);  // the adapter changed the greedy continuation
  auto [status, text] = served.post("/v1/completions", {{"model", "nosuch"}, {"prompt", prompt}});
  EXPECT_EQ(status, 404) << text;
  EXPECT_NE(text.find("'tiny', 'sql'"), std::string::npos) << text;
  // An adapter named like the served model could never be picked: refused at start.
  engine::EngineConfig clash = cfg;
  clash.lora_modules = {{"tiny", tmp.file("sql")}};
  EXPECT_THROW(server::Server(clash, o), std::invalid_argument);
}

}  // namespace
}  // namespace crl::test

// The HTTP API against the embedded engine, over loopback with httplib::Client.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "engine/model/lora.h"
#include "tests/engine/test_model.h"
#include "tests/server/server_test_util.h"
#include "tests/test_utils.h"

namespace crl::test {
namespace {

using json = nlohmann::json;

class ServerApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ServerOptions o;
    o.served_model_name = "tiny";
    o.max_body_bytes = 64 << 10;
    served_ = new ServedModel(server_test_config(), o);
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }
  // A separate engine instance for reference outputs.
  static engine::LlmEngine& reference() {
    if (!reference_) reference_ = new engine::LlmEngine(server_test_config());
    return *reference_;
  }
  static engine::RequestOutput reference_generate(engine::GenerateRequest r) {
    return reference().generate({std::move(r)}).at(0);
  }
  static ServedModel* served_;
  static engine::LlmEngine* reference_;
};
ServedModel* ServerApiTest::served_ = nullptr;
engine::LlmEngine* ServerApiTest::reference_ = nullptr;

void expect_error(const std::pair<int, std::string>& res, int status,
                  const std::string& param = "") {
  EXPECT_EQ(res.first, status) << res.second;
  json j = json::parse(res.second, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << res.second;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << res.second;
  EXPECT_TRUE(e.contains("type") && e.contains("param") && e.contains("code")) << res.second;
  if (!param.empty()) EXPECT_EQ(e["param"], param) << res.second;
}

TEST_F(ServerApiTest, HealthModelsAndMetrics) {
  auto c = served_->client();
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = c->Get("/v1/models");
  ASSERT_TRUE(models);
  json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum", "vllm:request_success_total", "crl:weight_version",
        "crl:kv_blocks_used", "crl:kv_blocks_free"}) {
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(served_->metric("crl:kv_blocks_total"), 256);
}

TEST_F(ServerApiTest, CompletionMatchesEngineGenerateStreamingAndNot) {
  struct Case {
    json prompt;
    int n;
    double temperature;
    uint64_t seed;
    std::vector<std::string> stop;
  };
  const std::vector<Case> cases = {
      {"Question: what is 3 plus 4? Answer:", 1, 0.0, 1, {}},
      {"The cat sat on", 3, 0.9, 7, {}},
      {json::array({5, 17, 99, 200, 31}), 2, 1.0, 11, {}},
      {"Once upon a time", 2, 1.0, 3, {"e", " the"}},  // stop strings: streamed text held back
  };
  for (const auto& tc : cases) {
    json body = {{"model", "tiny"},         {"prompt", tc.prompt},           {"n", tc.n},
                 {"max_tokens", 24},        {"temperature", tc.temperature}, {"seed", tc.seed},
                 {"return_token_ids", true}};
    if (!tc.stop.empty()) body["stop"] = tc.stop;
    engine::GenerateRequest ref;
    if (tc.prompt.is_string())
      ref.prompt = tc.prompt.get<std::string>();
    else
      ref.prompt_token_ids = tc.prompt.get<std::vector<int32_t>>();
    ref.params.n = tc.n;
    ref.params.max_tokens = 24;
    ref.params.temperature = tc.temperature;
    ref.params.seed = tc.seed;
    ref.params.stop = tc.stop;
    const engine::RequestOutput expected = reference_generate(ref);

    auto [status, text] = served_->post("/v1/completions", body);
    ASSERT_EQ(status, 200) << text;
    json r = json::parse(text);
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["weight_version"], 0);
    ASSERT_EQ(r["choices"].size(), static_cast<size_t>(tc.n));
    int64_t completion_tokens = 0;
    for (int k = 0; k < tc.n; ++k) {
      const json& ch = r["choices"][k];
      EXPECT_EQ(ch["index"], k);
      EXPECT_EQ(ch["text"], expected.outputs[k].text) << "sample " << k;
      EXPECT_EQ(ch["token_ids"].get<std::vector<int32_t>>(), expected.outputs[k].token_ids);
      EXPECT_EQ(ch["prompt_token_ids"].get<std::vector<int32_t>>(), expected.prompt_token_ids);
      EXPECT_EQ(ch["finish_reason"], engine::finish_reason_name(expected.outputs[k].finish_reason));
      completion_tokens += static_cast<int64_t>(expected.outputs[k].token_ids.size());
    }
    EXPECT_EQ(r["usage"]["prompt_tokens"], expected.prompt_token_ids.size());
    EXPECT_EQ(r["usage"]["completion_tokens"], completion_tokens);

    body["stream_options"] = {{"include_usage", true}};
    int stream_status = 0;
    auto events = served_->stream("/v1/completions", body, &stream_status);
    ASSERT_EQ(stream_status, 200);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::vector<std::string> texts(tc.n);
    std::vector<std::vector<int32_t>> ids(tc.n);
    std::vector<std::string> finish(tc.n);
    json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json chunk = json::parse(events[i]);
      EXPECT_EQ(chunk["weight_version"], 0);
      if (chunk["choices"].empty()) {
        usage = chunk["usage"];
        continue;
      }
      for (const auto& ch : chunk["choices"]) {
        const int k = ch["index"];
        texts[k] += ch["text"].get<std::string>();
        for (int32_t t : ch["token_ids"]) ids[k].push_back(t);
        if (!ch["finish_reason"].is_null()) finish[k] = ch["finish_reason"];
      }
    }
    for (int k = 0; k < tc.n; ++k) {
      EXPECT_EQ(texts[k], expected.outputs[k].text) << "streamed sample " << k;
      EXPECT_EQ(ids[k], expected.outputs[k].token_ids) << "streamed sample " << k;
      EXPECT_EQ(finish[k], engine::finish_reason_name(expected.outputs[k].finish_reason));
    }
    EXPECT_EQ(usage["completion_tokens"], completion_tokens);
  }
}

TEST_F(ServerApiTest, BatchOfPromptsLogprobsAndEcho) {
  json body = {{"prompt", json::array({"Hello there", "What is two plus two?"})},
               {"max_tokens", 6},
               {"temperature", 0},
               {"logprobs", 2},
               {"echo", true},
               {"ignore_eos", true}};
  auto [status, text] = served_->post("/v1/completions", body);
  ASSERT_EQ(status, 200) << text;
  json r = json::parse(text);
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][1]["text"].get<std::string>().rfind("What is two plus two?", 0), 0u);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
}

TEST_F(ServerApiTest, TokenizeDetokenizeRoundTrip) {
  const std::string text = "Question: what is 3 plus 4? Answer:";
  auto [status, body] = served_->post("/tokenize", {{"prompt", text}});
  ASSERT_EQ(status, 200) << body;
  json t = json::parse(body);
  const auto ids = t["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, reference().encode_prompt(text));
  EXPECT_EQ(t["count"], ids.size());
  // Special tokens (the BOS /tokenize added) are kept unless skip_special_tokens, as vLLM and
  // `colocated-rl detokenize` do.
  const text::Tokenizer& tok = *reference().tokenizer();
  ASSERT_TRUE(tok.is_special(ids.front())) << "the test model's prompts start with a BOS";
  auto [s2, b2] = served_->post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_EQ(json::parse(b2)["prompt"], tok.decode(ids, false));
  EXPECT_EQ(json::parse(b2)["prompt"].get<std::string>().rfind(tok.id_to_piece(ids.front()), 0), 0u)
      << b2;
  auto [s2s, b2s] = served_->post("/detokenize", {{"tokens", ids}, {"skip_special_tokens", true}});
  ASSERT_EQ(s2s, 200) << b2s;
  EXPECT_EQ(json::parse(b2s)["prompt"], text);

  // Token-in/token-out: the ids returned by one completion feed the next one unchanged.
  json body1 = {{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}, {"return_token_ids", true}};
  auto [s3, b3] = served_->post("/v1/completions", body1);
  ASSERT_EQ(s3, 200) << b3;
  json r = json::parse(b3);
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), ids);
  std::vector<int32_t> next = ids;
  for (int32_t id : r["choices"][0]["token_ids"]) next.push_back(id);
  auto [s4, b4] = served_->post("/v1/completions",
                                {{"prompt", next}, {"max_tokens", 1}, {"return_token_ids", true}});
  ASSERT_EQ(s4, 200) << b4;
  EXPECT_EQ(json::parse(b4)["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), next);
}

TEST_F(ServerApiTest, ChatCompletionUsesTheTemplateAndMatchesTheEngine) {
  json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                               {{"role", "user"}, {"content", "What is 3 plus 4?"}}});
  EXPECT_EQ(served_->server.chat_template().name(), std::string("plain"));
  auto [ts, tb] = served_->post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(ts, 200) << tb;
  const auto prompt_ids = json::parse(tb)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(prompt_ids,
            reference().encode_prompt("System: Be brief.\nUser: What is 3 plus 4?\nAssistant:"));

  json body = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0.7}, {"seed", 5},
               {"logprobs", true},     {"top_logprobs", 1}};
  auto [status, text] = served_->post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << text;
  json r = json::parse(text);
  EXPECT_EQ(r["object"], "chat.completion");
  engine::GenerateRequest ref;
  ref.prompt_token_ids = prompt_ids;
  ref.params.max_tokens = 12;
  ref.params.temperature = 0.7;
  ref.params.seed = 5;
  const auto expected = reference_generate(ref);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], expected.outputs[0].text);
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"].size(), expected.outputs[0].token_ids.size());
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_ids.size());

  auto events = served_->stream("/v1/chat/completions", body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& d = chunk["choices"][0]["delta"];
    if (i == 0) EXPECT_EQ(d["role"], "assistant");
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(content, expected.outputs[0].text);
}

TEST_F(ServerApiTest, BadRequestsGetOpenAIErrorsAndTheServerKeepsServing) {
  struct Bad {
    std::string path;
    std::string body;
    int status;
    std::string param;
  };
  const std::string long_prompt(3000, 'x');
  const std::vector<Bad> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", "[1, 2]", 400, ""},
      {"/v1/completions", "", 400, ""},
      {"/v1/completions", R"({"max_tokens": 4})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": []})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1, "a"]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [[]]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "n": "2"})", 400, "n"},
      {"/v1/completions", R"({"prompt": "hi", "n": 0})", 400, "n"},
      {"/v1/completions", R"({"prompt": "hi", "n": 100000})", 400, "n"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": -3})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 1.5})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 100000})", 400, ""},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 511})", 400, ""},  // + prompt > 512
      {"/v1/completions", R"({"prompt": "hi", "temperature": "hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": -1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "hi", "stop": 3})", 400, "stop"},
      {"/v1/completions", R"({"prompt": "hi", "stream": "yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt": "hi", "logprobs": 50})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt": "hi", "seed": "x"})", 400, "seed"},
      {"/v1/completions", R"({"prompt": [1, 2, 99999]})", 400, ""},
      {"/v1/completions", R"({"prompt": [1, 2, 99999999999]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": [-1]})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})", 404, "model"},
      {"/v1/completions", R"({"prompt": "hi", "model": 7})", 400, "model"},
      {"/v1/completions", R"({"prompt": "hi", "stream_options": 1})", 400, "stream_options"},
      {"/v1/completions", "{\"prompt\": \"" + long_prompt + "\"}", 400, ""},
      {"/v1/chat/completions", R"({"prompt": "hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400,
       "messages"},
      {"/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": "hello"})", 400, "messages"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400,
       "top_logprobs"},
      {"/tokenize", R"({"prompt": 3})", 400, "prompt"},
      {"/detokenize", R"({"tokens": [1, -5]})", 400, "tokens"},
      {"/detokenize", R"({"tokens": "abc"})", 400, "tokens"},
      {"/detokenize", R"({"tokens": [1], "skip_special_tokens": "yes"})", 400,
       "skip_special_tokens"},
      {"/pause", R"({"mode": "later"})", 400, "mode"},
      {"/v1/completions", std::string(70 << 10, ' '), 413, ""},
      {"/v1/nothing", "{}", 404, ""},
  };
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.path + " " + bad.body.substr(0, 80));
    expect_error(served_->post_raw(bad.path, bad.body), bad.status, bad.param);
  }
  auto [status, text] =
      served_->post("/v1/completions", {{"prompt", "still alive?"}, {"max_tokens", 3}});
  EXPECT_EQ(status, 200) << text;
  EXPECT_TRUE(served_->wait_idle(5));
}

TEST_F(ServerApiTest, WeightUpdatePostedBetweenStepsShowsInResponses) {
  std::atomic<int> hook_calls{0};
  served_->server.engine_loop().set_between_steps([&](engine::LlmEngine&) { hook_calls++; });
  auto before = served_->post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 3}});
  ASSERT_EQ(before.first, 200);
  EXPECT_GT(hook_calls.load(), 0);
  served_->server.engine_loop().set_between_steps(nullptr);
  const int64_t v0 = json::parse(before.second)["weight_version"];

  // What a weight sync does: runs on the engine thread between two steps, then bumps the version.
  served_->server.engine_loop()
      .post([](engine::LlmEngine& e) { e.apply_weight_update(e.weight_version() + 1); })
      .get();
  auto c = served_->client();
  auto res = c->Post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 3}}.dump(),
                     "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["weight_version"], v0 + 1);
  EXPECT_EQ(res->get_header_value("X-Weight-Version"), std::to_string(v0 + 1));
  EXPECT_EQ(served_->metric("crl:weight_version"), v0 + 1);
  auto reset = served_->post("/reset_prefix_cache", json::object());
  EXPECT_EQ(reset.first, 200) << reset.second;
}

// A client that goes away mid-request aborts it: finish reason abort (not length), blocks freed.
TEST_F(ServerApiTest, DisconnectedClientsAbortTheirRequests) {
  const std::string aborted =
      "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}";
  const double aborts0 = served_->metric(aborted);
  // Long generations: 8 samples x 480 tokens, with every engine step slowed to at least 2 ms so
  // they take far longer than the client waits on any CPU.
  served_->server.engine_loop().set_between_steps(
      [](engine::LlmEngine&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  struct Restore {
    ~Restore() { served_->server.engine_loop().set_between_steps(nullptr); }
  } restore;
  json body = {
      {"prompt", "Tell me a long story"}, {"max_tokens", 480}, {"n", 8}, {"ignore_eos", true}};

  {  // Non-streaming: the client's read times out and it closes the connection.
    auto c = served_->client(/*read_timeout_ms=*/300);
    auto res = c->Post("/v1/completions", body.dump(), "application/json");
    EXPECT_FALSE(res);
  }
  EXPECT_TRUE(served_->wait_idle(5));
  EXPECT_EQ(served_->metric(aborted), aborts0 + 1);

  {  // Streaming: the client stops reading after the first chunk.
    auto c = served_->client();
    body["stream"] = true;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
    auto res = c->send(req);
    EXPECT_EQ(res.error(), httplib::Error::Canceled);
  }
  EXPECT_TRUE(served_->wait_idle(5));
  EXPECT_EQ(served_->metric(aborted), aborts0 + 2);
}

// Holds the engine thread until the loop is paused (at most 30 s, so a failing test cannot wedge
// the server). Runs on the engine thread, from a posted task or the between-steps hook.
void hold_until_paused(engine::EngineLoop& loop) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!loop.paused() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Once some request has generated a token, holds the engine before its next step until the loop
// is paused: that request is then certainly in flight, and unfinished, when the test's /pause
// arrives, however fast the CPU. holding() says when the engine got there. The hook owns its state:
// the engine thread may still be calling a copy of it after this object is gone.
class HoldWhileGenerating {
 public:
  explicit HoldWhileGenerating(engine::EngineLoop& loop) : loop_(loop) {
    auto state = std::make_shared<State>();
    holding_ = state->promise.get_future();
    loop_.set_between_steps([state, &loop](engine::LlmEngine& e) {
      if (state->done) return;
      for (const engine::Sequence* s : e.scheduler().running()) {
        if (s->raw_logprobs.empty()) continue;
        state->done = true;
        state->promise.set_value();
        hold_until_paused(loop);
        return;
      }
    });
  }
  ~HoldWhileGenerating() { loop_.set_between_steps(nullptr); }
  bool holding(std::chrono::seconds timeout) {
    return holding_.wait_for(timeout) == std::future_status::ready;
  }

 private:
  struct State {
    std::promise<void> promise;
    bool done = false;  // engine thread only
  };
  engine::EngineLoop& loop_;
  std::future<void> holding_;
};

// A streaming completion on its own thread. accepted() says when the response headers arrived:
// the server sends them only once the request was submitted to the engine loop.
class BackgroundStream {
 public:
  BackgroundStream(const ServedModel& served, json body)
      : accepted_(accepted_promise_.get_future()) {
    body["stream"] = true;
    thread_ = std::thread([this, &served, body] {
      auto c = served.client();
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      req.response_handler = [this](const httplib::Response& r) {
        status_ = r.status;
        accepted_promise_.set_value();
        return true;
      };
      req.content_receiver = [this](const char* data, size_t n, uint64_t, uint64_t) {
        text_.append(data, n);
        return true;
      };
      auto res = c->send(req);
      if (!res) error_ = httplib::to_string(res.error());
    });
  }
  ~BackgroundStream() {
    if (thread_.joinable()) thread_.join();
  }
  bool accepted(std::chrono::seconds timeout) {
    return accepted_.wait_for(timeout) == std::future_status::ready;
  }
  // Waits for the end of the stream; the finish reason and token count of each choice.
  std::map<int, std::pair<std::string, size_t>> finish() {
    thread_.join();
    EXPECT_TRUE(error_.empty()) << error_;
    EXPECT_EQ(status_, 200) << text_;
    const auto events = sse_payloads(text_);
    EXPECT_FALSE(events.empty());
    if (!events.empty()) EXPECT_EQ(events.back(), "[DONE]");
    std::map<int, std::pair<std::string, size_t>> choices;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      const json chunk = json::parse(events[i]);
      for (const auto& ch : chunk["choices"]) {
        auto& [finish_reason, tokens] = choices[ch["index"].get<int>()];
        tokens += ch["token_ids"].size();
        if (!ch["finish_reason"].is_null()) finish_reason = ch["finish_reason"];
      }
    }
    return choices;
  }

 private:
  std::promise<void> accepted_promise_;
  std::future<void> accepted_;
  std::thread thread_;
  int status_ = 0;
  std::string text_;
  std::string error_;
};

// Ordering between /pause and a completion sent on another connection is only known to the test
// from evidence that the server accepted the request (a streaming response's headers) or that the
// engine is generating it; the request gauges lag behind the engine and cannot say whose request
// they count, so they are read only for what they count, and only after the engine thread has
// published them (fresh_metric).
TEST_F(ServerApiTest, PauseAbortWaitAndResume) {
  auto& loop = served_->server.engine_loop();
  const auto fresh_metric = [&](const std::string& name) {
    loop.post([](engine::LlmEngine&) {}).get();  // the gauges are published before this returns
    return served_->metric(name);
  };
  const auto pause_server = [&](const char* mode) {
    auto res = served_->post("/pause", {{"mode", mode}});
    EXPECT_EQ(res.first, 200) << res.second;
    EXPECT_TRUE(json::parse(res.second, nullptr, false).value("drained", false)) << res.second;
    EXPECT_TRUE(loop.paused());
  };
  const auto resume = [&] {
    EXPECT_EQ(served_->post("/resume", json::object()).first, 200);
    EXPECT_FALSE(loop.paused());
  };

  {  // abort mode, a request accepted but not yet seen by the engine thread: it is aborted too.
    auto engine_held = loop.post([&](engine::LlmEngine&) { hold_until_paused(loop); });
    BackgroundStream inflight(*served_, {{"prompt", "pause me"},
                                         {"max_tokens", 400},
                                         {"ignore_eos", true},
                                         {"return_token_ids", true}});
    ASSERT_TRUE(inflight.accepted(std::chrono::seconds(30)));
    pause_server("abort");
    engine_held.get();
    const auto choices = inflight.finish();
    ASSERT_EQ(choices.size(), 1u);
    EXPECT_EQ(choices.at(0).first, "abort");
    EXPECT_EQ(choices.at(0).second, 0u);
    resume();
  }

  {  // abort mode, a request generating: every sample ends with finish_reason "abort".
    HoldWhileGenerating hold(loop);
    json long_body = {{"prompt", "pause me"}, {"max_tokens", 400}, {"n", 4}, {"ignore_eos", true}};
    std::pair<int, std::string> inflight;
    std::thread t([&] { inflight = served_->post("/v1/completions", long_body); });
    const bool holding = hold.holding(std::chrono::seconds(30));
    if (holding) pause_server("abort");
    t.join();
    ASSERT_TRUE(holding);
    ASSERT_EQ(inflight.first, 200) << inflight.second;
    const json r = json::parse(inflight.second);
    ASSERT_EQ(r["choices"].size(), 4u);
    for (const auto& ch : r["choices"]) EXPECT_EQ(ch["finish_reason"], "abort") << inflight.second;
    EXPECT_LT(r["usage"]["completion_tokens"].get<int64_t>(), 4 * 400);
  }

  {  // While paused a request is held, not refused; resume admits it.
    std::pair<int, std::string> held;
    std::thread t([&] {
      held = served_->post("/v1/completions", {{"prompt", "later"}, {"max_tokens", 2}});
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (fresh_metric("vllm:num_requests_waiting") < 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Held by the loop, not in the engine: the engine thread has nothing to do.
    bool engine_busy = true;
    loop.post([&](engine::LlmEngine& e) { engine_busy = e.has_unfinished(); }).get();
    EXPECT_FALSE(engine_busy);
    EXPECT_EQ(fresh_metric("vllm:num_requests_waiting"), 1);
    EXPECT_EQ(fresh_metric("vllm:num_requests_running"), 0);
    resume();
    t.join();
    ASSERT_EQ(held.first, 200) << held.second;
    EXPECT_EQ(json::parse(held.second)["choices"][0]["finish_reason"], "length");
  }

  {  // wait mode: a request generating when /pause arrives finishes normally before it returns.
    HoldWhileGenerating hold(loop);
    BackgroundStream waited(*served_, {{"prompt", "finish me"},
                                       {"max_tokens", 40},
                                       {"ignore_eos", true},
                                       {"return_token_ids", true}});
    const bool holding = hold.holding(std::chrono::seconds(30));
    if (holding) pause_server("wait");
    const auto choices = waited.finish();
    ASSERT_TRUE(holding);
    ASSERT_EQ(choices.size(), 1u);
    EXPECT_EQ(choices.at(0).first, "length");
    EXPECT_EQ(choices.at(0).second, 40u);
    EXPECT_EQ(fresh_metric("vllm:num_requests_running"), 0);
    resume();
  }
}

}  // namespace
}  // namespace crl::test

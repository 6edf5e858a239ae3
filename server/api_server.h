// Server: the OpenAI-compatible HTTP API over one EngineLoop (docs/design.md §6).
//
// Endpoints:
//   POST /v1/completions, /v1/chat/completions   (stream: SSE chunks, then "data: [DONE]")
//   GET  /v1/models, /health (503 while the model loads), /metrics (Prometheus text)
//   POST /tokenize, /detokenize
//   POST /pause {"mode": "abort"|"wait"}, /resume, /reset_prefix_cache; GET /is_paused
// Every completion response carries the weight version that produced it: "weight_version" in
// the body and in every stream chunk, and the X-Weight-Version header (for a stream, the version
// when it started). Errors are OpenAI error objects with 4xx codes (413 for an oversize body,
// 429 + Retry-After when max_concurrent_requests completions are in flight). A client that
// disconnects aborts its requests at once, so their KV blocks are freed by the next step.
//
// Using it from the RL loop: build an EngineLoop (it owns the engine and its thread) and hand it to
// Server; the loop takes weight updates from its weight source between two engine steps
// (EngineLoop::set_weight_source), so responses carry each new version as it lands.
//
// Thread safety: start()/stop() from one thread; everything else runs on server threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_loop.h"
#include "server/api_types.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/sessions.h"
#include "text/chat_encoder.h"
#include "text/chat_template.h"

namespace crl::server {

class CompletionRenderer;

struct ServerOptions {
  // Address to bind; 0.0.0.0 serves every interface.
  std::string host = "127.0.0.1";
  // Port to bind; 0 picks a free one (see Server::port()).
  int port = 8000;
  // Model name in /v1/models and responses; empty: the model directory's name.
  std::string served_model_name;
  // HTTP worker threads; every open request (streams included) holds one.
  int http_threads = 128;
  // Completion requests in flight at most; more get 429 with Retry-After.
  int max_concurrent_requests = 96;
  // Seconds a 429 tells the client to wait.
  int retry_after_seconds = 1;
  // Request bodies over this size get 413.
  size_t max_body_bytes = size_t{8} << 20;
  // Seconds one request (head and body) may take to arrive; 408 after (HttpServerOptions).
  double request_timeout_s = 60;
  // Connections one remote address may hold open; more get 503 (0: no cap; loopback uncapped
  // unless cap_loopback_clients).
  int max_connections_per_client = 64;
  bool cap_loopback_clients = false;
  // When not empty, every endpoint but /health and /metrics needs "Authorization: Bearer KEY"
  // (401 otherwise), as vLLM's --api-key; with key_for_health_and_metrics those two as well.
  std::string api_key;
  bool key_for_health_and_metrics = false;
  ApiLimits limits;
  // Chat sessions (server/sessions.h): idle timeout, how many, tokens each.
  SessionLimits sessions;
  // What GET /version answers ({"version": ...}); the executable's version string.
  std::string version = "unknown";
};

class Server {
 public:
  // Serves a new engine built from `config` (loaded on the engine thread after start()).
  Server(engine::EngineConfig config, ServerOptions options);
  // Serves an engine loop owned with someone else (the RL loop); start() starts it if needed.
  Server(std::shared_ptr<engine::EngineLoop> loop, ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Starts the engine loop and the HTTP server; returns the bound port. /health answers 503
  // until the engine is loaded (engine::EngineLoop::wait_ready() blocks until then).
  int start();
  // Ends open requests, stops HTTP, then the engine loop if this server created it.
  void stop();

  int port() const { return http_.port(); }
  const std::string& model_name() const { return model_name_; }
  engine::EngineLoop& engine_loop() { return *loop_; }
  const text::ChatTemplate& chat_template() const { return chat_; }
  // Why the model's chat template could not be loaded (chat requests then get 400); "" if fine.
  const std::string& chat_template_error() const { return chat_error_; }

 private:
  HttpResponse handle_models(const HttpRequest& req);
  HttpResponse handle_health(const HttpRequest& req);
  HttpResponse handle_version(const HttpRequest& req);
  HttpResponse handle_metrics(const HttpRequest& req);
  HttpResponse handle_tokenize(const HttpRequest& req);
  HttpResponse handle_detokenize(const HttpRequest& req);
  HttpResponse handle_pause(const HttpRequest& req);
  HttpResponse handle_resume(const HttpRequest& req);
  HttpResponse handle_is_paused(const HttpRequest& req);
  HttpResponse handle_reset_prefix_cache(const HttpRequest& req);

  // Routes `path` to `handler`, behind the API key unless `open` (and the options keep it open).
  enum class Access { kKey, kOpenUnlessClosed };
  void route(const std::string& method, const std::string& path, HttpHandler handler,
             Access access = Access::kKey);
  // Runs a handler and maps what it throws to the response: an ApiError as itself (with
  // Retry-After on 429, x-should-retry: false on 409), anything else 500; counts the status.
  HttpResponse respond(const HttpRequest& req, const std::function<HttpResponse()>& handle);
  // A route's handler wrapped in respond().
  HttpHandler guarded(HttpResponse (Server::*handler)(const HttpRequest&));
  // Throws ApiError(503) while the engine is not loaded.
  void require_ready() const;
  // Throws ApiError(400) when the model's chat template failed to load.
  void require_chat_template() const;
  // Token ids of a chat prompt (text::ChatEncoder): control pieces written as text (</s>, <s>)
  // become their ids. The model's own template writes its BOS itself; the built-in formats get
  // the engine's.
  std::vector<int32_t> encode_chat(
      const std::string& text,
      const std::vector<std::pair<size_t, size_t>>* literal_spans = nullptr) const;
  // The session a chat request names ("session_id" or X-Session-Id), held for this request, with
  // the conversation's new turn appended; nullopt when it names none. Throws ApiError (400 for
  // bad fields, 409 when the conversation does not extend the session, 410 when it ended).
  struct SessionTurn {
    SessionStore::Lease lease;
    text::ChatTrajectory::Turn turn;
    std::string id;
  };
  // Appends the finished reply of `snap` to the session; the session's state for the response.
  static nlohmann::json append_reply(SessionTurn& s, const engine::RequestChannel::Snapshot& snap);
  std::optional<SessionTurn> session_turn(const HttpRequest& req, const nlohmann::json& body,
                                          const nlohmann::ordered_json* ordered, Endpoint endpoint,
                                          const CompletionJob& job);
  // 400 when the session with this turn's prompt and a reply of `max_tokens` passes its token cap.
  void check_session_cap(const SessionTurn& s, int64_t max_tokens) const;
  // /v1/completions and /v1/chat/completions: prepare, submit, then stream or await the reply.
  struct CompletionCall;
  HttpResponse handle_completion(const HttpRequest& req, Endpoint endpoint);
  // Parses the body into `call`: the job, the adapter it names, the session turn it opens and
  // its engine requests, tokenized and validated. Throws ApiError (400 before anything is queued).
  void prepare_completion(const HttpRequest& req, Endpoint endpoint, CompletionCall& call);
  // The reply as server-sent events; `slot` (the in-flight count's) is held until it closes.
  HttpResponse stream_completion(std::shared_ptr<engine::RequestChannel> channel,
                                 std::shared_ptr<CompletionRenderer> renderer,
                                 std::shared_ptr<std::optional<SessionTurn>> session,
                                 std::shared_ptr<void> slot);
  // The reply as one JSON body once every request finished (499 when the client left).
  HttpResponse await_completion(const HttpRequest& req, engine::RequestChannel& channel,
                                CompletionRenderer& renderer, std::optional<SessionTurn>& session);
  // The special-token literals of the model's tokenizer (split_special_tokens in chats); made at
  // the first use. Throws ApiError(400) when the model has no tokenizer.
  const std::vector<std::string>& special_literals() const;

  ServerOptions options_;
  std::shared_ptr<engine::EngineLoop> loop_;
  std::shared_ptr<ServerMetrics> metrics_;  // installed as the loop's request observer
  bool owns_loop_ = false;
  std::string model_name_;
  text::ChatTemplate chat_;
  std::string chat_error_;  // set when the model directory's chat template fails to load
  HttpServer http_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_id_{0};
  SessionStore sessions_;
  mutable std::once_flag chat_encoder_once_;
  mutable std::unique_ptr<text::ChatEncoder> chat_encoder_;  // made at the first chat request
  mutable std::once_flag special_literals_once_;
  mutable std::vector<std::string> special_literals_;
};

}  // namespace crl::server

#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>

#include "engine/model/config.h"
#include "server/completion_render.h"
#include "text/chat_encoder.h"
#include "text/template_error.h"
#include "text/tokenizer.h"

namespace crl::server {

namespace {

// generation_config.json's sampling defaults, for requests that give none. A directory whose
// config does not load is left to the engine, which reports it when it loads the model.
void apply_generation_defaults(const std::string& dir, ApiLimits& limits) {
  if (dir.empty() || !std::filesystem::exists(dir + "/config.json")) return;
  engine::ModelConfig c;
  try {
    c = engine::load_model_config(dir);
  } catch (const std::exception&) {
    return;
  }
  if (c.default_temperature >= 0) limits.default_temperature = c.default_temperature;
  if (c.default_top_p >= 0) limits.default_top_p = c.default_top_p;
  if (c.default_top_k >= 0) limits.default_top_k = static_cast<int32_t>(c.default_top_k);
  if (c.default_temperature >= 0 || c.default_top_p >= 0 || c.default_top_k >= 0) {
    spdlog::info(
        "sampling defaults from generation_config.json: temperature {}, top_p {}, top_k {}",
        limits.default_temperature, limits.default_top_p, limits.default_top_k);
  }
}

using json = nlohmann::json;
constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr int kClientClosedRequest = 499;  // nginx's status for "client went away"

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(int status, const std::string& message, const std::string& param = "",
                            const std::string& code = "") {
  return json_response(status, error_json(status, message, param, code));
}

std::string default_model_name(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const std::string name = std::filesystem::path(d).filename().string();
  return name.empty() ? "model" : name;
}

// Decrements the in-flight count when the last holder (handler or stream) lets go.
class InFlightSlot {
 public:
  explicit InFlightSlot(std::atomic<int>& count) : count_(count) {}
  ~InFlightSlot() { count_--; }
  InFlightSlot(const InFlightSlot&) = delete;
  InFlightSlot& operator=(const InFlightSlot&) = delete;

 private:
  std::atomic<int>& count_;
};

}  // namespace

Server::Server(engine::EngineConfig config, ServerOptions options)
    : Server(std::make_shared<engine::EngineLoop>(std::move(config)), std::move(options)) {
  owns_loop_ = true;
}

Server::Server(std::shared_ptr<engine::EngineLoop> loop, ServerOptions options)
    : options_(std::move(options)),
      loop_(std::move(loop)),
      metrics_(std::make_shared<ServerMetrics>()),
      http_([&] {
        HttpServerOptions h;
        h.threads = options_.http_threads;
        h.max_body_bytes = options_.max_body_bytes;
        h.error_body = [](int status) {
          std::string message = "request failed";
          std::string code;
          if (status == 404) message = "no such endpoint", code = "not_found";
          if (status == 405) message = "method not allowed";
          if (status == 413) message = "the request body is too large", code = "payload_too_large";
          if (status == 400) message = "malformed HTTP request";
          if (status >= 500) message = "internal server error";
          return dump_json(error_json(status, message, "", code));
        };
        return h;
      }()),
      sessions_(options_.sessions) {
  loop_->set_request_observer(metrics_);
  const std::string& dir = loop_->config().model_dir;
  model_name_ =
      options_.served_model_name.empty() ? default_model_name(dir) : options_.served_model_name;
  for (const auto& [name, lora_dir] : loop_->config().lora_modules) {
    if (name == model_name_) {
      throw std::invalid_argument(
          "--lora " + name + "=" + lora_dir +
          ": the adapter's name is the served model's; "
          "requests could never pick it (rename it or set --served-model-name)");
    }
  }
  try {
    chat_ = text::ChatTemplate::from_model_dir(dir);
  } catch (const std::exception& e) {  // serve completions; chat requests report it
    chat_error_ = e.what();
    spdlog::error("chat template of {} unusable: {}", dir, chat_error_);
  }
  apply_generation_defaults(dir, options_.limits);
  route("POST", "/v1/completions", [this](const HttpRequest& r) {
    return respond(r, [&] { return handle_completion(r, Endpoint::kCompletions); });
  });
  route("POST", "/v1/chat/completions", [this](const HttpRequest& r) {
    return respond(r, [&] { return handle_completion(r, Endpoint::kChat); });
  });
  route("GET", "/v1/models", guarded(&Server::handle_models));
  route("GET", "/health", guarded(&Server::handle_health), Access::kOpenUnlessClosed);
  route("GET", "/metrics", guarded(&Server::handle_metrics), Access::kOpenUnlessClosed);
  route("POST", "/tokenize", guarded(&Server::handle_tokenize));
  route("POST", "/detokenize", guarded(&Server::handle_detokenize));
  route("POST", "/pause", guarded(&Server::handle_pause));
  route("POST", "/resume", guarded(&Server::handle_resume));
  route("GET", "/is_paused", guarded(&Server::handle_is_paused));
  route("POST", "/reset_prefix_cache", guarded(&Server::handle_reset_prefix_cache));
}

Server::~Server() { stop(); }

int Server::start() {
  loop_->start();
  const int port = http_.start(options_.host, options_.port);
  const std::string& h = options_.host;
  const bool loopback = h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
  if (options_.api_key.empty() && !loopback) {
    spdlog::warn(
        "serving on {}:{} without an API key: anyone who can reach it can generate and "
        "call /pause, /resume and /reset_prefix_cache (set --api-key or CRL_API_KEY)",
        h, port);
  }
  spdlog::info("serving {} on http://{}:{} (chat template: {})", model_name_, options_.host, port,
               chat_.name());
  return port;
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  // Handlers poll stopping_ and return; then the HTTP workers can be joined.
  http_.stop();
  if (owns_loop_) loop_->stop();
}

// ---------------------------------------------------------------------------------------------
// Plumbing

void Server::route(const std::string& method, const std::string& path, HttpHandler handler,
                   Access access) {
  const bool keyed =
      !options_.api_key.empty() && (access == Access::kKey || options_.key_for_health_and_metrics);
  if (!keyed) return http_.route(method, path, std::move(handler));
  http_.route(method, path, [this, handler = std::move(handler)](const HttpRequest& req) {
    auto it = req.headers.find("authorization");
    if (it == req.headers.end() || !bearer_token_matches(it->second, options_.api_key)) {
      HttpResponse res = error_response(
          401,
          it == req.headers.end()
              ? "this server needs an API key: send the header 'Authorization: Bearer KEY'"
              : "incorrect API key provided",
          "", "invalid_api_key");
      res.headers.emplace_back("WWW-Authenticate", "Bearer");
      metrics_->record_http_status(res.status);
      return res;
    }
    return handler(req);
  });
}

HttpResponse Server::respond(const HttpRequest& req, const std::function<HttpResponse()>& handle) {
  HttpResponse res;
  try {
    res = handle();
  } catch (const ApiError& e) {
    res = error_response(e.status(), e.what(), e.param(), e.code());
    if (e.status() == 429)
      res.headers.emplace_back("Retry-After", std::to_string(options_.retry_after_seconds));
    // A session conflict stays one when asked again: OpenAI's SDKs retry 409s unless told not to.
    if (e.status() == 409) res.headers.emplace_back("x-should-retry", "false");
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", req.method, req.path, e.what());
    res = error_response(500, std::string("internal error: ") + e.what());
  } catch (...) {
    res = error_response(500, "internal error");
  }
  metrics_->record_http_status(res.status);
  return res;
}

HttpHandler Server::guarded(HttpResponse (Server::*handler)(const HttpRequest&)) {
  return [this, handler](const HttpRequest& req) {
    return respond(req, [&] { return (this->*handler)(req); });
  };
}

void Server::require_ready() const {
  if (loop_->ready()) return;
  const std::string err = loop_->load_error();
  throw ApiError(503,
                 err.empty() ? "the model is still loading" : "the model failed to load: " + err);
}

void Server::require_chat_template() const {
  if (!chat_error_.empty()) {
    throw ApiError(400, "the model's chat template cannot be used: " + chat_error_, "messages",
                   "chat_template_error");
  }
}

const std::vector<std::string>& Server::special_literals() const {
  const text::Tokenizer* tok = loop_->engine().tokenizer();
  if (!tok) throw ApiError(400, "this model has no tokenizer: use /v1/completions with token ids");
  std::call_once(special_literals_once_,
                 [&] { special_literals_ = text::special_token_literals(*tok); });
  return special_literals_;
}

std::vector<int32_t> Server::encode_chat(
    const std::string& text, const std::vector<std::pair<size_t, size_t>>* literal_spans) const {
  const engine::LlmEngine& eng = loop_->engine();
  const text::Tokenizer* tok = eng.tokenizer();
  if (!tok) throw ApiError(400, "this model has no tokenizer: use /v1/completions with token ids");
  std::call_once(chat_encoder_once_, [&] {
    // BOS when the model wants one, unless the model's template writes it.
    chat_encoder_ = std::make_unique<text::ChatEncoder>(
        *tok, chat_.is_jinja() ? std::vector<int32_t>() : eng.prompt_prefix());
  });
  return chat_encoder_->encode(text, literal_spans);
}

json Server::append_reply(SessionTurn& s, const engine::RequestChannel::Snapshot& snap) {
  const engine::RequestOutput& out = *snap.outputs.at(0);
  if (!out.error.empty() || out.outputs.empty()) return nullptr;  // the turn stays open: a retry
  const engine::CompletionOutput& c = out.outputs[0];
  text::ChatTrajectory& t = s.lease->trajectory;
  t.append_completion(c.token_ids, {{"role", "assistant"}, {"content", c.text}});
  return {{"id", s.id},
          {"length", t.ids().size()},
          {"segments", t.segment_starts().size()},
          {"new_segment", s.turn.new_segment},
          {"rewound", s.turn.rewound},
          {"created", s.lease.created()}};
}

std::optional<Server::SessionTurn> Server::session_turn(const HttpRequest& req, const json& body,
                                                        const nlohmann::ordered_json* ordered,
                                                        Endpoint endpoint,
                                                        const CompletionJob& job) {
  std::string id = job.session_id;
  auto header = req.headers.find("x-session-id");
  if (header != req.headers.end() && !header->second.empty()) {
    if (!id.empty() && id != header->second) {
      throw ApiError(400, "'session_id' and the X-Session-Id header name different sessions",
                     "session_id");
    }
    id = header->second;
  }
  if (id.empty()) return std::nullopt;
  if (id.size() > 256) throw ApiError(400, "'session_id' is longer than 256 bytes", "session_id");
  if (endpoint != Endpoint::kChat) {
    throw ApiError(400, "sessions are for /v1/chat/completions (a session is a conversation)",
                   "session_id");
  }
  if (job.params.n != 1)
    throw ApiError(400, "a session continues one conversation: 'n' must be 1", "n");
  if (job.split_special_tokens) {
    throw ApiError(400, "'split_special_tokens' does not go with sessions", "split_special_tokens");
  }
  const text::ChatRenderOptions options = chat_render_options(*ordered);
  if (!options.add_generation_prompt || options.continue_final_message) {
    throw ApiError(400,
                   "a session turn opens the assistant's reply: no 'continue_final_message', "
                   "no 'add_generation_prompt': false",
                   "add_generation_prompt");
  }
  const text::Tokenizer* tok = loop_->engine().tokenizer();
  if (!tok) throw ApiError(400, "this model has no tokenizer: sessions need one", "session_id");
  // Compared as values: the same tools with their keys in another order (another client library's
  // serialisation) are the same tools; the session keeps rendering the first turn's.
  const std::string key =
      nlohmann::json::parse(
          nlohmann::ordered_json{{"tools", options.tools}, {"kwargs", options.kwargs}}.dump())
          .dump();
  SessionStore::Lease lease = sessions_.acquire(id, [&] {
    std::vector<int32_t> prefix =
        chat_.is_jinja() ? std::vector<int32_t>() : loop_->engine().prompt_prefix();
    return std::make_unique<Session>(text::ChatTrajectory(chat_, *tok, std::move(prefix), options),
                                     key);
  });
  if (lease->options_key != key) {
    throw ApiError(409, "'tools' and 'chat_template_kwargs' differ from the session's first turn",
                   "tools", "session_conflict");
  }
  text::ChatTrajectory::Turn turn;
  try {
    turn = lease->trajectory.extend(parse_messages((*ordered)["messages"]));
  } catch (const text::NotAnExtension& e) {
    throw ApiError(409, "session '" + id + "': " + e.what(), "messages", "session_conflict");
  } catch (const text::TemplateError& e) {
    throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(),
                   "messages");
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "messages");
  }
  return SessionTurn{std::move(lease), std::move(turn), id};
}

void Server::check_session_cap(const SessionTurn& s, int64_t max_tokens) const {
  // The reply may take all of max_tokens (the rest of the context when the request gave none).
  const int64_t want = static_cast<int64_t>(s.lease->trajectory.ids().size()) + max_tokens;
  if (want > sessions_.limits().max_tokens) {
    throw ApiError(400,
                   fmt::format("session '{}' would hold {} tokens with this turn, over its cap of "
                               "{} (serve --max-session-tokens)",
                               s.id, want, sessions_.limits().max_tokens),
                   "max_tokens");
  }
}

// ---------------------------------------------------------------------------------------------
// Completions

// A completion request made ready for the engine: its job, its engine requests (tokenized and
// validated) and the session turn it opened, which is taken back unless the requests were
// submitted (the session, and the turn a retry would rewind, stay as they were).
struct Server::CompletionCall {
  CompletionJob job;
  std::string id;    // "chatcmpl-..." or "cmpl-..."
  std::string lora;  // the adapter the "model" field names; "" for the base model
  // Shared with a stream's writer, which appends the reply when the stream ends.
  std::shared_ptr<std::optional<SessionTurn>> session =
      std::make_shared<std::optional<SessionTurn>>();
  std::vector<engine::GenerateRequest> requests;
  std::vector<std::string> echo_texts;
  bool submitted = false;

  CompletionCall() = default;
  CompletionCall(const CompletionCall&) = delete;
  CompletionCall& operator=(const CompletionCall&) = delete;
  ~CompletionCall() {
    std::optional<SessionTurn>& s = *session;
    if (!submitted && s && s->lease->trajectory.turn_open()) s->lease->trajectory.abort_turn();
  }
};

HttpResponse Server::handle_completion(const HttpRequest& req, Endpoint endpoint) {
  require_ready();
  CompletionCall call;
  prepare_completion(req, endpoint, call);
  if (++in_flight_ > options_.max_concurrent_requests) {
    in_flight_--;
    throw ApiError(429,
                   "too many requests in flight (" +
                       std::to_string(options_.max_concurrent_requests) + "): retry later",
                   "", "rate_limit_exceeded");
  }
  auto slot = std::make_shared<InFlightSlot>(in_flight_);
  std::shared_ptr<engine::RequestChannel> channel;
  try {
    channel = loop_->submit(std::move(call.requests));
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), param_from_message(e.what()));
  } catch (const std::runtime_error& e) {
    throw ApiError(503, e.what());
  }
  call.submitted = true;
  auto renderer = std::make_shared<CompletionRenderer>(
      call.job, call.id, call.lora.empty() ? model_name_ : call.lora,
      static_cast<int64_t>(std::time(nullptr)), loop_->engine().tokenizer(),
      std::move(call.echo_texts));
  if (call.job.stream) return stream_completion(channel, renderer, call.session, slot);
  return await_completion(req, *channel, *renderer, *call.session);
}

void Server::prepare_completion(const HttpRequest& req, Endpoint endpoint, CompletionCall& call) {
  const json body = parse_json_object(req.body);
  std::optional<nlohmann::ordered_json> ordered;
  if (endpoint == Endpoint::kChat) {
    require_chat_template();
    ordered = nlohmann::ordered_json::parse(req.body);  // key order kept for the template
  }
  const std::vector<std::string> unknown = unknown_fields(body, endpoint);
  if (!unknown.empty()) {
    spdlog::warn("{}: ignoring unknown field(s) {}",
                 endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions",
                 fmt::join(unknown, ", "));
  }
  const bool split = split_special_tokens_field(body, options_.limits.split_special_tokens);
  call.job = parse_completion_request(
      body, endpoint, options_.limits, chat_, ordered ? &*ordered : nullptr,
      split && endpoint == Endpoint::kChat ? &special_literals() : nullptr);
  const CompletionJob& job = call.job;
  const engine::LlmEngine& eng = loop_->engine();
  // The "model" field: the base model's name (or none) runs the base, an adapter's name that LoRA.
  if (!job.model.empty() && job.model != model_name_) {
    const std::vector<std::string> adapters = eng.loras().names();
    if (std::find(adapters.begin(), adapters.end(), job.model) == adapters.end()) {
      std::string served = "'" + model_name_ + "'";
      for (const auto& a : adapters) served += ", '" + a + "'";
      throw ApiError(
          400, "the model '" + job.model + "' does not exist (this server serves " + served + ")",
          "model", "model_not_found");
    }
    call.lora = job.model;
  }
  call.session = std::make_shared<std::optional<SessionTurn>>(
      session_turn(req, body, ordered ? &*ordered : nullptr, endpoint, job));
  std::optional<SessionTurn>& session = *call.session;

  // Requests, tokenized and validated here so a bad one is a 400 before anything is queued.
  const uint64_t serial = next_id_++;
  call.id = fmt::format("{}-{:x}{:06x}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl",
                        static_cast<uint64_t>(std::time(nullptr)), serial);
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    const PromptInput& p = job.prompts[i];
    engine::GenerateRequest r;
    r.request_id = call.id + "-" + std::to_string(i);
    r.params = job.params;
    r.lora = call.lora;
    try {
      if (session) {
        r.prompt_token_ids = session->lease->trajectory.prompt();
      } else if (!p.is_text) {
        r.prompt_token_ids = p.token_ids;
      } else if (endpoint == Endpoint::kChat) {
        r.prompt_token_ids = encode_chat(p.text, &p.literal_spans);
      } else {
        r.prompt_token_ids = eng.encode_prompt(p.text, job.split_special_tokens);
      }
      if (endpoint == Endpoint::kChat && !job.max_tokens_given) {  // the rest of the context
        int64_t room = eng.max_model_len() - static_cast<int64_t>(r.prompt_token_ids.size());
        if (session) {  // and of the session's token cap
          room = std::min<int64_t>(
              room, sessions_.limits().max_tokens -
                        static_cast<int64_t>(session->lease->trajectory.ids().size()));
        }
        r.params.max_tokens = static_cast<int32_t>(std::max<int64_t>(1, room));
        r.params.min_tokens = std::min(r.params.min_tokens, r.params.max_tokens);
      }
      if (session) check_session_cap(*session, r.params.max_tokens);
      eng.validate_request(r);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), param_from_message(e.what()));
    }
    if (job.echo) {
      call.echo_texts.push_back(
          p.is_text ? p.text : (eng.tokenizer() ? eng.tokenizer()->decode(p.token_ids) : ""));
    }
    call.requests.push_back(std::move(r));
  }
}

HttpResponse Server::stream_completion(std::shared_ptr<engine::RequestChannel> channel,
                                       std::shared_ptr<CompletionRenderer> renderer,
                                       std::shared_ptr<std::optional<SessionTurn>> session,
                                       std::shared_ptr<void> slot) {
  engine::EngineLoop* loop = loop_.get();
  const std::vector<std::string> ids = channel->ids();
  HttpResponse res;
  res.content_type = "text/event-stream";
  res.headers.emplace_back("Cache-Control", "no-cache");
  res.headers.emplace_back("X-Weight-Version", std::to_string(loop->gauges().weight_version));
  if (*session) res.headers.emplace_back("X-Session-Id", (*session)->id);
  res.stream = [this, channel, renderer, loop, ids, session](ChunkSink& sink) {
    uint64_t seen = 0;
    auto last_check = std::chrono::steady_clock::now();
    while (true) {
      engine::RequestChannel::Snapshot snap = channel->wait(seen, kPollInterval);
      if (snap.version != seen) {
        seen = snap.version;
        const std::string events = renderer->stream_update(snap);
        if (!events.empty() && !sink.write(events)) break;
      }
      // A write to a closed connection can still succeed once: look at the socket too.
      if (std::chrono::steady_clock::now() - last_check >= kPollInterval) {
        last_check = std::chrono::steady_clock::now();
        if (!snap.all_finished && !sink.is_alive()) break;
      }
      if (snap.all_finished) {
        if (*session) append_reply(**session, snap);
        session->reset();  // the session is free once its reply is in, before the last chunk
        return sink.write(renderer->stream_end(snap));
      }
      if (stopping_) break;
    }
    loop->abort(ids);  // the client left (or the server stops): free the KV blocks now
    session->reset();  // the turn stays open: a retry rewinds it
    return false;
  };
  // Also covers a client that left before the stream started. Aborting a finished request is
  // a no-op; the slot is released with the last reference.
  res.on_close = [loop, ids, slot]() { loop->abort(ids); };
  return res;
}

HttpResponse Server::await_completion(const HttpRequest& req, engine::RequestChannel& channel,
                                      CompletionRenderer& renderer,
                                      std::optional<SessionTurn>& session) {
  engine::EngineLoop* loop = loop_.get();
  const std::vector<std::string> ids = channel.ids();
  uint64_t seen = 0;
  engine::RequestChannel::Snapshot snap;
  auto last_check = std::chrono::steady_clock::now();
  while (true) {
    snap = channel.wait(seen, kPollInterval);
    if (snap.all_finished) break;
    // Outputs may arrive every step, so look at the socket by the clock, not only when idle.
    if (std::chrono::steady_clock::now() - last_check >= kPollInterval) {
      last_check = std::chrono::steady_clock::now();
      if (req.is_connection_alive && !req.is_connection_alive()) {
        loop->abort(ids);
        return error_response(kClientClosedRequest, "the client closed the connection");
      }
    }
    if (stopping_) {
      loop->abort(ids);
      throw ApiError(503, "the server is shutting down");
    }
    seen = snap.version;
  }
  json out = renderer.response(snap);
  if (session) out["session"] = append_reply(*session, snap);
  HttpResponse res = json_response(200, out);
  if (session) res.headers.emplace_back("X-Session-Id", session->id);
  res.headers.emplace_back("X-Weight-Version",
                           std::to_string(CompletionRenderer::weight_version(snap)));
  res.headers.emplace_back("X-First-Weight-Version",
                           std::to_string(CompletionRenderer::first_weight_version(snap)));
  return res;
}

// ---------------------------------------------------------------------------------------------
// Other endpoints

HttpResponse Server::handle_models(const HttpRequest&) {
  json model = {{"id", model_name_},
                {"object", "model"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"owned_by", "colocated-rl"},
                {"root", loop_->config().model_dir},
                {"max_model_len", loop_->ready() ? loop_->engine().max_model_len() : 0},
                {"weight_version", loop_->gauges().weight_version}};
  json data = json::array({model});
  if (loop_->ready()) {  // the LoRA adapters, vLLM's way: each a model whose parent is the base
    for (const std::string& name : loop_->engine().loras().names()) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", model["created"]},
                      {"owned_by", "colocated-rl"},
                      {"root", name},
                      {"parent", model_name_},
                      {"max_model_len", model["max_model_len"]}});
    }
  }
  return json_response(200, {{"object", "list"}, {"data", data}});
}

HttpResponse Server::handle_health(const HttpRequest&) {
  if (loop_->ready()) {
    HttpResponse r =
        json_response(200, {{"status", "ok"}, {"weight_version", loop_->gauges().weight_version}});
    return r;
  }
  const std::string err = loop_->load_error();
  if (!err.empty()) return json_response(503, {{"status", "error"}, {"message", err}});
  return json_response(503, {{"status", "loading"}});
}

HttpResponse Server::handle_metrics(const HttpRequest&) {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics_->render(loop_->gauges(), model_name_);
  return r;
}

HttpResponse Server::handle_tokenize(const HttpRequest& req) {
  require_ready();
  const json body = parse_json_object(req.body);
  const engine::LlmEngine& eng = loop_->engine();
  bool add_special = true;
  if (body.contains("add_special_tokens") && !body["add_special_tokens"].is_null()) {
    if (!body["add_special_tokens"].is_boolean()) {
      throw ApiError(400, "'add_special_tokens' must be a boolean", "add_special_tokens",
                     "invalid_type");
    }
    add_special = body["add_special_tokens"].get<bool>();
  }
  const bool split = split_special_tokens_field(body, options_.limits.split_special_tokens);
  std::vector<int32_t> ids;
  try {
    if (body.contains("messages")) {
      require_chat_template();
      std::vector<std::pair<size_t, size_t>> spans;
      const std::string rendered = render_chat(chat_, nlohmann::ordered_json::parse(req.body),
                                               split ? &special_literals() : nullptr, &spans);
      ids = encode_chat(rendered, &spans);
    } else if (body.contains("prompt") && body["prompt"].is_string()) {
      const std::string prompt = body["prompt"].get<std::string>();
      if (add_special) {
        ids = eng.encode_prompt(prompt, split);
      } else {
        if (!eng.tokenizer()) throw ApiError(400, "this model has no tokenizer");
        text::EncodeOptions options;
        options.split_special_tokens = split;
        ids = eng.tokenizer()->encode(prompt, options);
      }
    } else {
      throw ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt");
    }
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what());
  }
  if (!add_special && body.contains("messages")) {
    // A built-in chat format's ids start with the BOS the encoder adds; the model's own template
    // writes its BOS as text, which stays (as in vLLM).
    const std::vector<int32_t> bos = eng.prompt_prefix();
    if (!chat_.is_jinja() && !bos.empty() && !ids.empty() && ids.front() == bos.front())
      ids.erase(ids.begin());
  }
  return json_response(
      200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", eng.max_model_len()}});
}

HttpResponse Server::handle_detokenize(const HttpRequest& req) {
  require_ready();
  const json body = parse_json_object(req.body);
  const text::Tokenizer* tok = loop_->engine().tokenizer();
  if (!tok) throw ApiError(400, "this model has no tokenizer");
  return json_response(200, {{"prompt", detokenize_body(*tok, body, "tokens")}});
}

HttpResponse Server::handle_pause(const HttpRequest& req) {
  require_ready();
  engine::PauseMode mode = engine::PauseMode::kAbort;
  double timeout_s = 600;
  if (!req.body.empty()) {
    const json body = parse_json_object(req.body);
    if (body.contains("mode") && !body["mode"].is_null()) {
      if (!body["mode"].is_string())
        throw ApiError(400, "'mode' must be a string", "mode", "invalid_type");
      const std::string m = body["mode"].get<std::string>();
      if (m == "wait") {
        mode = engine::PauseMode::kWait;
      } else if (m != "abort") {
        throw ApiError(400, "'mode' must be \"abort\" or \"wait\", got \"" + m + "\"", "mode");
      }
    }
    if (body.contains("timeout") && !body["timeout"].is_null()) {
      if (!body["timeout"].is_number() || body["timeout"].get<double>() < 0) {
        throw ApiError(400, "'timeout' must be a number of seconds >= 0", "timeout");
      }
      timeout_s = body["timeout"].get<double>();
    }
  }
  const bool drained = loop_->pause(
      mode, std::chrono::milliseconds(static_cast<int64_t>(std::min(timeout_s, 86400.0) * 1000)));
  return json_response(200, {{"paused", true},
                             {"drained", drained},
                             {"mode", mode == engine::PauseMode::kWait ? "wait" : "abort"}});
}

HttpResponse Server::handle_resume(const HttpRequest&) {
  require_ready();
  loop_->resume();
  return json_response(200, {{"paused", false}});
}

HttpResponse Server::handle_is_paused(const HttpRequest&) {
  return json_response(200, {{"is_paused", loop_->paused()}});
}

HttpResponse Server::handle_reset_prefix_cache(const HttpRequest&) {
  require_ready();
  loop_->post([](engine::LlmEngine& e) { e.reset_prefix_cache(); }).get();
  return json_response(200, {{"status", "ok"}});
}

}  // namespace crl::server

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
#include "server/api_server_internal.h"
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

std::string default_model_name(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const std::string name = std::filesystem::path(d).filename().string();
  return name.empty() ? "model" : name;
}

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
        h.request_timeout_s = options_.request_timeout_s;
        h.head_timeout_s = std::min(h.head_timeout_s, options_.request_timeout_s);
        h.max_connections_per_client = options_.max_connections_per_client;
        h.cap_loopback_clients = options_.cap_loopback_clients;
        h.error_body = [](int status) {
          std::string message = "request failed";
          std::string code;
          if (status == 404) message = "no such endpoint", code = "not_found";
          if (status == 405) message = "method not allowed";
          if (status == 413) message = "the request body is too large", code = "payload_too_large";
          if (status == 400) message = "malformed HTTP request";
          if (status == 408) message = "the request did not arrive in time", code = "timeout";
          if (status == 503)
            message = "too many connections from this address", code = "overloaded";
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
  route("GET", "/version", guarded(&Server::handle_version), Access::kOpenUnlessClosed);
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
  // The key is checked on the headers, before a body is read.
  http_.route(
      method, path, std::move(handler),
      [this](const HttpRequest& req) -> std::optional<HttpResponse> {
        auto it = req.headers.find("authorization");
        if (it != req.headers.end() && bearer_token_matches(it->second, options_.api_key)) {
          return std::nullopt;
        }
        HttpResponse res = error_response(
            401,
            it == req.headers.end()
                ? "this server needs an API key: send the header 'Authorization: Bearer KEY'"
                : "incorrect API key provided",
            "", "invalid_api_key");
        res.headers.emplace_back("WWW-Authenticate", "Bearer");
        metrics_->record_http_status(res.status);
        return res;
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
  // As LlmEngine::encode_prompt: a chat that cannot fit is refused before it is encoded whole.
  if (tok->exceeds_tokens(text, eng.max_model_len())) {
    throw ApiError(400,
                   "the chat (" + std::to_string(text.size()) +
                       " bytes rendered) exceeds the context length " +
                       std::to_string(eng.max_model_len()) + " tokens",
                   "messages");
  }
  return chat_encoder_->encode(text, literal_spans);
}

// ---------------------------------------------------------------------------------------------
// Other endpoints

HttpResponse Server::handle_version(const HttpRequest&) {
  return json_response(200, {{"version", options_.version}});
}

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

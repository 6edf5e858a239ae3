// The Server's completions (/v1/completions, /v1/chat/completions) and the chat sessions they
// continue: a request is prepared (parsed, tokenized, validated, its session turn opened),
// submitted to the engine loop, then streamed or awaited. See api_server.h.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <optional>

#include "server/api_server.h"
#include "server/api_server_internal.h"
#include "server/completion_render.h"
#include "text/template_error.h"
#include "text/tokenizer.h"

namespace crl::server {

using json = nlohmann::json;

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
  if (std::any_of(id.begin(), id.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) == 0x7f;
      })) {
    throw ApiError(400, "'session_id' holds a control character", "session_id");
  }
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
  refuse_unimplemented_fields(body, endpoint);
  const std::vector<std::string> unknown = unknown_fields(body, endpoint);
  if (!unknown.empty()) {
    // As JSON strings (a name is the client's text: a newline in it must not forge a log line),
    // the first ten.
    std::string names;
    for (size_t i = 0; i < unknown.size() && i < 10; ++i) {
      names += (i ? ", " : "") + json(unknown[i]).dump();
    }
    if (unknown.size() > 10) names += fmt::format(" and {} more", unknown.size() - 10);
    spdlog::warn("{}: ignoring unknown field(s) {}",
                 endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions", names);
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
      throw ApiError(  // 404 as vLLM answers it
          404, "the model '" + job.model + "' does not exist (this server serves " + served + ")",
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

}  // namespace crl::server

#include "server/completion_render.h"

#include <algorithm>

#include "text/utf8.h"

namespace crl::server {

namespace {

using json = nlohmann::json;

const std::string kReplacementChar =
    "\xEF\xBF\xBD";  // U+FFFD, what a cut UTF-8 sequence decodes to

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Largest cut <= n that does not split a UTF-8 character of s.
size_t utf8_boundary(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

json finish_reason_json(const engine::CompletionOutput& c) {
  if (c.finish_reason == engine::FinishReason::kNone) return nullptr;
  return engine::finish_reason_name(c.finish_reason);
}

json stop_reason_json(const engine::CompletionOutput& c) {
  if (c.stop_token) return *c.stop_token;
  if (c.stop_string) return *c.stop_string;
  return nullptr;
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
  return b;
}

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

CompletionRenderer::CompletionRenderer(const CompletionJob& job, std::string id, std::string model,
                                       int64_t created, const text::Tokenizer* tokenizer,
                                       std::vector<std::string> echo_texts)
    : job_(job),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      tokenizer_(tokenizer),
      echo_texts_(std::move(echo_texts)),
      choices_(job.prompts.size() * static_cast<size_t>(job.params.n)) {
  for (const auto& s : job_.params.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

std::string CompletionRenderer::decode(const std::vector<int32_t>& ids) const {
  if (!tokenizer_) return "";
  return tokenizer_->decode_generated(ids, job_.params.skip_special_tokens);
}

CompletionRenderer::TokenRepr CompletionRenderer::token_repr(const std::vector<int32_t>& ids,
                                                             size_t pos, int32_t id) const {
  if (!tokenizer_ || id < 0 || id >= tokenizer_->vocab_size()) return {};
  // A special token is shown as itself (vLLM), though skip_special_tokens leaves it out of the
  // text.
  if (tokenizer_->is_special(id)) {
    std::string piece = tokenizer_->id_to_piece(id);
    return {piece, piece};
  }
  std::string bytes = tokenizer_->appended_bytes(ids, pos, id, job_.params.skip_special_tokens);
  // The token's text is its bytes alone as UTF-8, an incomplete character shown as U+FFFD (what
  // vLLM shows: Hugging Face's decode of the one token); `bytes` keeps them exactly.
  return {text::utf8_lossy(bytes), std::move(bytes)};
}

json CompletionRenderer::logprobs_json(const engine::CompletionOutput& c, size_t from, size_t to,
                                       int64_t* text_offset) const {
  to = std::min({to, c.token_ids.size(), c.raw_logprobs.size()});
  if (job_.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const TokenRepr tok = token_repr(c.token_ids, i, c.token_ids[i]);
      json e = {
          {"token", tok.text}, {"logprob", c.raw_logprobs[i]}, {"bytes", bytes_json(tok.bytes)}};
      json tops = json::array();
      if (i < c.top_logprobs.size()) {
        for (const auto& [id, lp] : c.top_logprobs[i]) {
          const TokenRepr t = token_repr(c.token_ids, i, id);
          tops.push_back({{"token", t.text}, {"logprob", lp}, {"bytes", bytes_json(t.bytes)}});
        }
      }
      e["top_logprobs"] = tops;
      content.push_back(e);
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), offsets = json::array();
  json tops = job_.top_logprobs > 0 ? json::array() : json(nullptr);
  for (size_t i = from; i < to; ++i) {
    const TokenRepr tok = token_repr(c.token_ids, i, c.token_ids[i]);
    tokens.push_back(tok.text);
    token_logprobs.push_back(c.raw_logprobs[i]);
    offsets.push_back(*text_offset);
    *text_offset += code_points(tok.text);  // as vLLM: the offset counts the tokens' characters
    if (job_.top_logprobs > 0) {
      json row = json::object();
      if (i < c.top_logprobs.size()) {
        for (const auto& [id, lp] : c.top_logprobs[i])
          row[token_repr(c.token_ids, i, id).text] = lp;
      }
      tops.push_back(row);
    }
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json CompletionRenderer::chunk(size_t choice, json fields, int64_t weight_version) const {
  fields["index"] = choice;
  const bool chat = job_.endpoint == Endpoint::kChat;
  return {{"id", id_},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", json::array({fields})},
          {"weight_version", weight_version}};
}

std::string CompletionRenderer::stream_update(const engine::RequestChannel::Snapshot& snap) {
  std::string events;
  const size_t n = static_cast<size_t>(job_.params.n);
  const bool chat = job_.endpoint == Endpoint::kChat;
  for (size_t p = 0; p < snap.outputs.size(); ++p) {
    if (!snap.outputs[p]) continue;
    const engine::RequestOutput& out = *snap.outputs[p];
    if (!out.error.empty()) {
      if (!error_sent_) {
        events += "data: " + dump_json(error_json(500, out.error)) + "\n\n";
        error_sent_ = true;
      }
      continue;
    }
    for (const auto& c : out.outputs) {
      const size_t ci = p * n + static_cast<size_t>(c.index);
      if (ci >= choices_.size()) continue;
      ChoiceState& st = choices_[ci];
      if (st.finished) continue;
      const bool finished = c.finish_reason != engine::FinishReason::kNone;
      std::string full;
      if (finished) {
        full = c.text;
      } else {
        full = decode(c.token_ids);
        if (ends_with(full, kReplacementChar)) full = st.text_sent;  // wait for the rest
        if (max_stop_len_ > 1 && full.size() > st.text_sent.size()) {
          const size_t keep =
              full.size() >= max_stop_len_ - 1 ? full.size() - (max_stop_len_ - 1) : 0;
          full.resize(std::max(st.text_sent.size(), utf8_boundary(full, keep)));
        }
      }
      std::string delta;
      if (full.size() > st.text_sent.size() &&
          full.compare(0, st.text_sent.size(), st.text_sent) == 0) {
        delta = full.substr(st.text_sent.size());
      }
      const size_t ntok = c.token_ids.size();
      const bool new_tokens = ntok > st.tokens_sent;
      if (st.started && delta.empty() && !new_tokens && !finished) continue;

      if (!delta.empty()) st.text_sent = full;
      json fields;
      // The echoed prompt is not part of the completion text the engine reports.
      if (!st.started && !chat && job_.echo && p < echo_texts_.size())
        delta = echo_texts_[p] + delta;
      if (chat) {
        json d = json::object();
        if (!st.started) d["role"] = "assistant";
        if (!delta.empty() || !st.started) d["content"] = delta;
        fields["delta"] = d;
      } else {
        fields["text"] = delta;
      }
      fields["logprobs"] = nullptr;
      if (job_.logprobs && new_tokens) {
        fields["logprobs"] = logprobs_json(c, st.tokens_sent, ntok, &st.text_offset);
      }
      fields["finish_reason"] = finish_reason_json(c);
      if (finished) fields["stop_reason"] = stop_reason_json(c);
      if (job_.return_token_ids) {
        fields["token_ids"] = std::vector<int32_t>(
            c.token_ids.begin() + static_cast<long>(std::min(st.tokens_sent, ntok)),
            c.token_ids.end());
        if (!st.started) fields["prompt_token_ids"] = out.prompt_token_ids;
      }
      events += "data: " + dump_json(chunk(ci, fields, out.weight_version)) + "\n\n";
      st.tokens_sent = ntok;
      st.started = true;
      st.finished = finished;
    }
  }
  return events;
}

std::string CompletionRenderer::stream_end(const engine::RequestChannel::Snapshot& snap) const {
  std::string events;
  if (job_.include_usage) {
    json u = {
        {"id", id_},
        {"object", job_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
        {"created", created_},
        {"model", model_},
        {"choices", json::array()},
        {"usage", usage(snap)},
        {"weight_version", weight_version(snap)},
        {"first_weight_version", first_weight_version(snap)}};
    events += "data: " + dump_json(u) + "\n\n";
  }
  events += "data: [DONE]\n\n";
  return events;
}

json CompletionRenderer::usage(const engine::RequestChannel::Snapshot& snap) const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& out : snap.outputs) {
    if (!out) continue;
    prompt += static_cast<int64_t>(out->prompt_token_ids.size());
    cached += out->num_cached_tokens;
    for (const auto& c : out->outputs) completion += static_cast<int64_t>(c.token_ids.size());
  }
  // cached_tokens: prompt tokens the prefix cache served (OpenAI's and vLLM's field).
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

int64_t CompletionRenderer::weight_version(const engine::RequestChannel::Snapshot& snap) {
  int64_t v = -1;
  for (const auto& out : snap.outputs) {
    if (out) v = std::max(v, out->weight_version);
  }
  return v;
}

int64_t CompletionRenderer::first_weight_version(const engine::RequestChannel::Snapshot& snap) {
  int64_t v = -1;
  for (const auto& out : snap.outputs) {
    if (out && (v < 0 || out->first_weight_version < v)) v = out->first_weight_version;
  }
  return v;
}

json CompletionRenderer::response(const engine::RequestChannel::Snapshot& snap) const {
  const bool chat = job_.endpoint == Endpoint::kChat;
  const size_t n = static_cast<size_t>(job_.params.n);
  json choices = json::array();
  for (size_t p = 0; p < snap.outputs.size(); ++p) {
    if (!snap.outputs[p]) throw ApiError(500, "the engine returned no output for a prompt");
    const engine::RequestOutput& out = *snap.outputs[p];
    if (!out.error.empty()) throw ApiError(500, out.error);
    for (const auto& c : out.outputs) {
      json choice;
      choice["index"] = p * n + static_cast<size_t>(c.index);
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      } else {
        choice["text"] =
            (job_.echo && p < echo_texts_.size() ? echo_texts_[p] : std::string()) + c.text;
      }
      int64_t offset = 0;
      choice["logprobs"] =
          job_.logprobs ? logprobs_json(c, 0, c.token_ids.size(), &offset) : json(nullptr);
      choice["finish_reason"] = finish_reason_json(c);
      choice["stop_reason"] = stop_reason_json(c);
      if (job_.return_token_ids) {
        choice["token_ids"] = c.token_ids;
        if (!chat) choice["prompt_token_ids"] = out.prompt_token_ids;
      }
      choices.push_back(choice);
    }
  }
  json r = {{"id", id_},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", choices},
            {"usage", usage(snap)},
            {"weight_version", weight_version(snap)},
            {"first_weight_version", first_weight_version(snap)}};
  if (chat && job_.return_token_ids && !snap.outputs.empty() && snap.outputs[0]) {
    r["prompt_token_ids"] = snap.outputs[0]->prompt_token_ids;
  }
  return r;
}

}  // namespace crl::server

// OpenAI-style request parsing and error objects for the HTTP API (no engine, no httplib).
//
// parse_completion_request() type-checks every field it knows and throws ApiError (400) naming
// the field; unknown fields are ignored, as OpenAI does.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "text/chat_template.h"

namespace crl::text {
class Tokenizer;
}

namespace crl::server {

// An error returned to the client as {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// The OpenAI error object for `status` (type from the status: invalid_request_error for 4xx,
// server_error for 5xx; empty param/code become null).
nlohmann::json error_json(int status, const std::string& message, const std::string& param = "",
                          const std::string& code = "");

enum class Endpoint { kCompletions, kChat };

// One prompt of a request: text, or token ids (token-in).
struct PromptInput {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> token_ids;
  // A chat with split_special_tokens: where the special-token literals of its messages are in
  // `text` (they are encoded as text; the template's own are tokens).
  std::vector<std::pair<size_t, size_t>> literal_spans;
};

struct ApiLimits {
  int32_t max_n = 64;        // samples per prompt
  int32_t max_prompts = 64;  // prompts in one /v1/completions request
  int32_t max_tokens = 1 << 20;
  // Sampling values for requests that give none: the model's generation_config.json defaults
  // when it has them (as vLLM applies them), else OpenAI's.
  double default_temperature = 1.0;
  double default_top_p = 1.0;
  int32_t default_top_k = 0;  // 0: off
  // The default of the request field "split_special_tokens" (serve --split-special-tokens).
  bool split_special_tokens = false;
};

struct CompletionJob {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                 // empty when the request named none
  std::vector<PromptInput> prompts;  // chat: one, the rendered conversation
  engine::SamplingParams params;     // shared by every prompt
  bool max_tokens_given = false;     // chat without max_tokens: the rest of the context
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool echo = false;              // completions: the prompt text before the completion
  bool return_token_ids = false;  // token-out: prompt and completion token ids
  bool logprobs = false;          // return log-probs of the sampled tokens
  int32_t top_logprobs = 0;       // and this many alternatives at each position
  // Special-token literals in prompt text (completions) or message contents (chat) are text.
  bool split_special_tokens = false;
  // The chat session the request continues ("session_id"; "" when it names none). The server
  // also takes it from the X-Session-Id header.
  std::string session_id;
};

// Parses a /v1/completions or /v1/chat/completions body. Chat messages are rendered with
// `chat` into one text prompt (render_chat). `ordered_body`, the same body parsed keeping key
// order, gives the chat fields their order (tool schemas are printed by the template as given);
// without it they come from `body`. `special_literals` (text::special_token_literals of the
// model's tokenizer) is needed for a chat with split_special_tokens. Throws ApiError(400).
CompletionJob parse_completion_request(const nlohmann::json& body, Endpoint endpoint,
                                       const ApiLimits& limits, const text::ChatTemplate& chat,
                                       const nlohmann::ordered_json* ordered_body = nullptr,
                                       const std::vector<std::string>* special_literals = nullptr);

// The "split_special_tokens" field of a body (default `fallback`); ApiError(400) unless a boolean.
bool split_special_tokens_field(const nlohmann::json& body, bool fallback);

// The top-level fields of a completions / chat body that this server does not know (sorted):
// ignored, as vLLM does (the server logs a warning naming them).
std::vector<std::string> unknown_fields(const nlohmann::json& body, Endpoint endpoint);

// OpenAI and vLLM fields this server knows but does not implement, refused with ApiError(400)
// naming the field (code "unsupported_parameter") when set to anything but their no-op value,
// so a client never gets a silently different output: logit_bias ({}), best_of (n), response_format
// ({"type": "text"}), suffix (""), use_beam_search (false),
// guided_json/guided_regex/guided_choice/guided_grammar, tool_choice other than "auto" and
// parallel_tool_calls false (chat: tool calls are parsed from the text, not forced). "user" is
// accepted and ignored (it only names the caller).
void refuse_unimplemented_fields(const nlohmann::json& body, Endpoint endpoint);

// The body as a JSON object; throws ApiError(400) for malformed JSON or another type.
nlohmann::json parse_json_object(const std::string& body);

// The messages of a body's "messages" field as the chat template takes them: role, content (a
// string, a list of text parts {"type": "text", "text": ...}, or null; text::ChatTemplate gives
// a template the form it takes), and when
// given name, tool_call_id, reasoning_content and tool_calls (whose JSON-string "arguments" are
// parsed into objects, as vLLM does for templates). Throws ApiError(400).
nlohmann::ordered_json parse_messages(const nlohmann::ordered_json& messages);

// The template options of a chat body: tools, add_generation_prompt (default true),
// continue_final_message, chat_template_kwargs. Throws ApiError(400) naming a bad field.
text::ChatRenderOptions chat_render_options(const nlohmann::ordered_json& body);

// Renders a chat body (messages, tools, add_generation_prompt (default true),
// continue_final_message, chat_template_kwargs) with `chat`. Bad fields, and a template that
// fails or raises, are ApiError(400) with param "messages" (or the field).
// With `special_literals` (split_special_tokens), the literals in message contents are masked
// for the template (text::SpecialLiteralMask) and `literal_spans` says where they are in the
// render.
std::string render_chat(const text::ChatTemplate& chat, const nlohmann::ordered_json& body,
                        const std::vector<std::string>* special_literals = nullptr,
                        std::vector<std::pair<size_t, size_t>>* literal_spans = nullptr);

// Token ids to text for POST /detokenize ({"tokens": [...]}) and `colocated-rl detokenize`
// ({"ids": [...]} lines): the ids under `ids_field`, each inside the vocabulary, decoded with
// special tokens kept unless the body's "skip_special_tokens" (default `skip_default`) is true,
// as Hugging Face's decode and vLLM's /detokenize. Throws ApiError(400) naming the field.
std::string detokenize_body(const text::Tokenizer& tokenizer, const nlohmann::json& body,
                            const std::string& ids_field, bool skip_default = false);

// True when an Authorization header value is "Bearer <key>". Every byte of `key` is compared
// whatever the value holds (no early exit), so the time taken does not reveal how much of a
// guess was right.
bool bearer_token_matches(const std::string& authorization, const std::string& key);

// The field name quoted in an engine validation message ("invalid sampling parameter 'n': ...");
// empty when none.
std::string param_from_message(const std::string& message);

}  // namespace crl::server

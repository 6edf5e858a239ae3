// ChatTemplate: renders a conversation into a prompt with the model's own chat template.
//
// Loaded from a Hugging Face model directory: <dir>/chat_template.jinja when present, else
// tokenizer_config.json's "chat_template" (a string, or the named list form
// [{"name": ..., "template": ...}], where "tool_use" is chosen when tools are given and
// "default" otherwise, as transformers does), rendered by the project's Jinja interpreter
// (text/jinja) with the variables transformers passes: messages, tools, documents,
// add_generation_prompt, bos_token / eos_token / unk_token / pad_token (strings or the
// {"content": ...} AddedToken form), then the caller's extra kwargs (e.g. enable_thinking).
// A directory with no template renders with BuiltinChatTemplate's plain format.
//
// Messages are JSON objects as OpenAI and transformers give them: role, content (string, list
// of parts, or null), and when present tool_calls, tool_call_id, name, reasoning_content, ...
// Content reaches the template in the form it takes, as vLLM's "auto" content format: a list of
// parts for a template that loops over a message's content (jinja::Template::
// iterates_message_content), else a string (text parts joined by newlines).
// The server (server/api_types.cpp) and the trainer's `messages` data rows both render here.
//
// Thread safety: immutable after loading; render() may run on many threads at once.
#pragma once

#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/builtin_chat_template.h"

namespace crl::text {

namespace jinja {
class Template;
}

struct ChatRenderOptions {
  // Open the assistant's turn at the end (transformers' add_generation_prompt).
  bool add_generation_prompt = true;
  // Leave the last message open so the model continues it (transformers' and vLLM's
  // continue_final_message); excludes add_generation_prompt.
  bool continue_final_message = false;
  // Tool schemas ([{"type": "function", "function": {...}}]); null: no tools.
  nlohmann::ordered_json tools = nullptr;
  // Extra template variables (vLLM's chat_template_kwargs), e.g. {"enable_thinking": false}.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // The time strftime_now() formats; unset: now.
  std::optional<std::time_t> now;
  // Pass every content to the template exactly as given, as transformers' apply_chat_template
  // does; default: in the form the template takes (vLLM's "auto" content format, above).
  bool content_as_given = false;
};

class ChatTemplate {
 public:
  // The built-in plain format.
  ChatTemplate();

  // Reads <dir>/chat_template.jinja or <dir>/tokenizer_config.json; the built-in plain format
  // when neither carries a template. Throws std::invalid_argument naming the file and JSON path
  // (malformed config) or crl::text::jinja::TemplateError naming the file and template line
  // (a template that does not parse).
  static ChatTemplate from_model_dir(const std::string& dir);
  // From a parsed tokenizer_config.json; `origin` names it in errors.
  static ChatTemplate from_tokenizer_config(const nlohmann::ordered_json& config,
                                            const std::string& origin);
  // One Jinja template with its special tokens ("" leaves a token undefined).
  static ChatTemplate from_jinja(const std::string& source, const std::string& bos_token = "",
                                 const std::string& eos_token = "",
                                 const std::string& name = "chat_template");
  // A built-in format (tests, and callers that want one explicitly).
  static ChatTemplate builtin(const BuiltinChatTemplate& format);

  // True when the model's own Jinja template renders (the prompt then writes its BOS itself).
  bool is_jinja() const { return !templates_.empty(); }
  // "jinja" or the built-in format's name ("plain", "chatml", ...).
  std::string name() const;

  // The prompt for `messages` (a JSON list of message objects). Throws std::invalid_argument for
  // bad messages or options and crl::text::jinja::TemplateError when the template fails
  // (raise_exception() in the template: kind kRaised, message() is its text).
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatRenderOptions& options = {}) const;

 private:
  const jinja::Template& select(bool has_tools) const;

  BuiltinChatTemplate builtin_;
  std::map<std::string, std::shared_ptr<const jinja::Template>>
      templates_;  // by name; "default" for a string
  nlohmann::ordered_json special_tokens_ =
      nlohmann::ordered_json::object();  // bos_token, eos_token, ...
};

}  // namespace crl::text

// Tool calls in a model's reply (issue 28): which syntax the model's chat template uses, where a
// tool-calling turn ends, and the reply's text parsed into content + calls.
//
// Two syntaxes, as vLLM's `hermes` and `llama3_json` parsers read them:
//   kHermes      Qwen2.5/Qwen3, Hermes-2-Pro, SmolLM3 ...: any number of
//                  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//                blocks; the text outside them is the content. The turn ends at "</tool_call>"
//                (a stop string) or at the end of turn.
//   kLlama3Json  Llama-3.1/3.2: the whole reply is the call, optionally after <|python_tag|>:
//                  {"name": "f", "parameters": {...}}      ("arguments" is read too),
//                several separated by ';'. A reply that does not start with '{' is content. The
//                turn ends at the end of turn (<|eot_id|> / <|eom_id|>, the model's EOS ids).
// detect_tool_call_format() renders a probe conversation holding one tool call with the template
// and looks at how the template printed it; a template that prints neither form (the built-in
// plain format, Mistral's [TOOL_CALLS]) gets kHermes, which a model can be taught on any
// tokenizer (the embedded default model's included).
//
// A call that does not parse (bad JSON, no name, arguments not an object, an unterminated
// <tool_call>) is never an exception: it is reported in ParsedReply::errors, for the caller to
// answer with an error observation.
//
// Thread safety: free functions over immutable inputs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "text/chat_template.h"

namespace crl::text {

class Tokenizer;

enum class ToolCallFormat { kHermes, kLlama3Json };

// "hermes" | "llama3_json"; parse_tool_call_format throws std::invalid_argument listing them.
const char* tool_call_format_name(ToolCallFormat format);
ToolCallFormat parse_tool_call_format(const std::string& name);

// The syntax `chat` prints an assistant's tool call in (see the top of this file).
ToolCallFormat detect_tool_call_format(const ChatTemplate& chat);

struct ToolCall {
  std::string id;  // "call_<k>" in reply order (the caller may rename)
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // always an object
};

struct ParsedReply {
  std::string content;              // the text outside the calls, trimmed
  std::vector<ToolCall> calls;      // the calls that parsed, in order
  std::vector<std::string> errors;  // one line per call that did not parse, saying why
  // The assistant message for the chat template: role, content, and tool_calls when there are
  // calls (OpenAI's form, with arguments as an object, as templates take them).
  nlohmann::ordered_json message() const;
};

// Parses a reply's text (special tokens may be present or skipped; <|python_tag|> is dropped).
ParsedReply parse_tool_calls(ToolCallFormat format, const std::string& text);

// Stop strings that end a tool-calling turn ("</tool_call>" for kHermes; none for kLlama3Json).
std::vector<std::string> tool_call_stop_strings(ToolCallFormat format);

// The ids of `tokenizer` that are the tool-call markers of `format` as single special tokens
// (kHermes: "<tool_call>" and "</tool_call>" where the tokenizer marks them special; none
// otherwise). Text decoded with special tokens skipped never shows them and a stop string never
// matches them: a turn stops on close_id (a stop token id) and is decoded with decode_reply.
struct ToolCallMarkers {
  std::vector<int32_t> ids;  // every marker that is a special token
  std::optional<int32_t> close_id;
};
ToolCallMarkers special_tool_call_markers(const Tokenizer& tokenizer, ToolCallFormat format);

// A reply's text for parse_tool_calls: special tokens skipped but the markers kept.
std::string decode_reply(const Tokenizer& tokenizer, const ToolCallMarkers& markers,
                         const std::vector<int32_t>& ids);

// The text a model writes for `call` in `format` (demonstrations, tests): parse_tool_calls reads
// it back as `call`.
std::string format_tool_call(ToolCallFormat format, const ToolCall& call);

}  // namespace crl::text

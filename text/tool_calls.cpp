#include "text/tool_calls.h"

#include <algorithm>
#include <stdexcept>

#include "common/json_depth.h"
#include "text/tokenizer.h"

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kOpen = "<tool_call>";
const char* const kClose = "</tool_call>";
const char* const kPythonTag = "<|python_tag|>";

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// At most 80 bytes of `s`, for error lines (which become tool messages: cut at a UTF-8 character
// boundary, so the message stays valid UTF-8).
std::string excerpt(const std::string& s) {
  if (s.size() <= 80) return s;
  size_t cut = 77;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

// One call object: {"name": string, "arguments" | "parameters": object or a JSON string of one}.
// Returns the error ("" when it parsed).
std::string read_call(const std::string& json_text, ToolCall* call) {
  bool too_deep = false;
  ojson j = parse_untrusted_json<ojson>(json_text, &too_deep);
  if (too_deep) {
    return "tool call nests deeper than " + std::to_string(kMaxJsonDepth) +
           " levels: " + excerpt(json_text);
  }
  if (j.is_discarded()) return "tool call is not valid JSON: " + excerpt(json_text);
  if (!j.is_object()) return "tool call must be a JSON object: " + excerpt(json_text);
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    return "tool call has no \"name\" string: " + excerpt(json_text);
  }
  call->name = j["name"].get<std::string>();
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  if (!j.contains(key) || j[key].is_null()) {
    call->arguments = ojson::object();
    return "";
  }
  ojson args = j[key];
  if (args.is_string()) {
    ojson inner = parse_untrusted_json<ojson>(args.get<std::string>());
    if (inner.is_discarded()) {
      return "tool call '" + call->name +
             "': arguments are a string that is not JSON (or nests deeper than " +
             std::to_string(kMaxJsonDepth) + " levels)";
    }
    args = inner;
  }
  if (!args.is_object()) return "tool call '" + call->name + "': arguments must be an object";
  call->arguments = std::move(args);
  return "";
}

void add_call(ParsedReply& r, const std::string& json_text) {
  ToolCall call;
  std::string error = read_call(trim(json_text), &call);
  if (!error.empty()) {
    r.errors.push_back(error);
    return;
  }
  call.id = "call_" + std::to_string(r.calls.size());
  r.calls.push_back(std::move(call));
}

ParsedReply parse_hermes(const std::string& text) {
  ParsedReply r;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) {
      content += text.substr(at);
      break;
    }
    content += text.substr(at, open - at);
    const size_t body = open + std::string(kOpen).size();
    const size_t close = text.find(kClose, body);
    if (close == std::string::npos) {
      r.errors.push_back("unterminated tool call (<tool_call> without </tool_call>): " +
                         excerpt(trim(text.substr(body))));
      break;
    }
    add_call(r, text.substr(body, close - body));
    at = close + std::string(kClose).size();
  }
  r.content = trim(content);
  return r;
}

// Splits `s` at the ';' that separate top-level JSON values (not inside strings or brackets).
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts;
  int depth = 0;
  bool in_string = false, escaped = false;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      ++depth;
    else if (c == '}' || c == ']')
      --depth;
    else if (c == ';' && depth == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(s.substr(start));
  return parts;
}

ParsedReply parse_llama3(const std::string& text) {
  ParsedReply r;
  std::string t = text;
  const size_t tag = t.find(kPythonTag);
  const bool tagged = tag != std::string::npos;
  if (tagged) t = t.substr(tag + std::string(kPythonTag).size());
  t = trim(t);
  if (!tagged && (t.empty() || t[0] != '{')) {
    r.content = trim(text);
    return r;
  }
  for (const std::string& part : split_top_level(t)) {
    if (trim(part).empty()) continue;
    add_call(r, part);
  }
  if (r.calls.empty() && r.errors.empty())
    r.errors.push_back("empty tool call after <|python_tag|>");
  return r;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
  return format == ToolCallFormat::kHermes ? "hermes" : "llama3_json";
}

ToolCallFormat parse_tool_call_format(const std::string& name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  throw std::invalid_argument("unknown tool-call format '" + name + "' (hermes, llama3_json)");
}

ToolCallFormat detect_tool_call_format(const ChatTemplate& chat) {
  if (!chat.is_jinja()) return ToolCallFormat::kHermes;
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_0", "type": "function",
                     "function": {"name": "crl_probe_add", "arguments": {"a": 12, "b": 30}}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "crl_probe_add", "content": "42"}])");
  ChatRenderOptions o;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "crl_probe_add",
    "description": "Adds two integers.", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
  std::string text;
  try {
    text = chat.render(messages, o);
  } catch (const std::exception&) {
    return ToolCallFormat::kHermes;
  }
  // Where the call's name is printed, which form surrounds it.
  const size_t name = text.rfind("\"crl_probe_add\"");
  if (name == std::string::npos) return ToolCallFormat::kHermes;
  const size_t open = text.rfind(kOpen, name);
  if (open != std::string::npos && name - open < 40) return ToolCallFormat::kHermes;
  if (text.find("\"parameters\"", name) != std::string::npos) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kHermes;
}

ParsedReply parse_tool_calls(ToolCallFormat format, const std::string& text) {
  return format == ToolCallFormat::kHermes ? parse_hermes(text) : parse_llama3(text);
}

std::vector<std::string> tool_call_stop_strings(ToolCallFormat format) {
  if (format == ToolCallFormat::kHermes) return {kClose};
  return {};
}

ToolCallMarkers special_tool_call_markers(const Tokenizer& tokenizer, ToolCallFormat format) {
  ToolCallMarkers m;
  if (format != ToolCallFormat::kHermes) return m;
  for (const char* marker : {kOpen, kClose}) {
    const std::vector<int32_t> ids = tokenizer.encode(marker);
    if (ids.size() != 1 || !tokenizer.is_special(ids[0])) continue;
    if (tokenizer.decode({ids[0]}, /*skip_special_tokens=*/false) != marker) continue;
    m.ids.push_back(ids[0]);
    if (std::string(marker) == kClose) m.close_id = ids[0];
  }
  return m;
}

std::string decode_reply(const Tokenizer& tokenizer, const ToolCallMarkers& markers,
                         const std::vector<int32_t>& ids) {
  if (markers.ids.empty()) return tokenizer.decode_generated(ids);
  // Special tokens dropped but the markers, decoded with the rest.
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) continue;
    if (tokenizer.is_special(id) &&
        std::find(markers.ids.begin(), markers.ids.end(), id) == markers.ids.end()) {
      continue;
    }
    kept.push_back(id);
  }
  return tokenizer.decode(kept, /*skip_special_tokens=*/false);
}

std::string format_tool_call(ToolCallFormat format, const ToolCall& call) {
  if (format == ToolCallFormat::kHermes) {
    ojson j = {{"name", call.name}, {"arguments", call.arguments}};
    return std::string(kOpen) + "\n" + j.dump() + "\n" + kClose;
  }
  ojson j = {{"name", call.name}, {"parameters", call.arguments}};
  return j.dump();
}

ojson ParsedReply::message() const {
  ojson m = {{"role", "assistant"}, {"content", content}};
  if (!calls.empty()) {
    ojson list = ojson::array();
    for (const ToolCall& c : calls) {
      list.push_back({{"id", c.id},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    m["tool_calls"] = std::move(list);
  }
  return m;
}

}  // namespace crl::text

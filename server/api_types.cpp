#include "server/api_types.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "common/json_depth.h"
#include "text/chat_encoder.h"
#include "text/template_error.h"
#include "text/tokenizer.h"

namespace crl::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

template <typename Json>
const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

template <typename Json>
[[noreturn]] void bad_type(const std::string& key, const char* expected, const Json& v) {
  throw ApiError(400, "'" + key + "' must be " + expected + ", got " + type_name(v), key,
                 "invalid_type");
}

bool has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// An integer field in [lo, hi] (JSON numbers with a fraction are refused).
std::optional<int64_t> opt_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  if (!has(j, key)) return std::nullopt;
  const json& v = j.at(key);
  if (!v.is_number_integer()) bad_type(key, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw ApiError(400,
                   "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "], got " + v.dump(),
                   key, "out_of_range");
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    throw ApiError(400,
                   "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "], got " + std::to_string(x),
                   key, "out_of_range");
  }
  return x;
}

std::optional<double> opt_number(const json& j, const char* key) {
  if (!has(j, key)) return std::nullopt;
  const json& v = j.at(key);
  if (!v.is_number()) bad_type(key, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw ApiError(400, "'" + std::string(key) + "' must be finite", key);
  return x;
}

std::optional<bool> opt_bool(const json& j, const char* key) {
  if (!has(j, key)) return std::nullopt;
  const json& v = j.at(key);
  if (!v.is_boolean()) bad_type(key, "a boolean", v);
  return v.get<bool>();
}

std::vector<int32_t> int_list(const json& v, const std::string& key) {
  if (!v.is_array()) bad_type(key, "a list of integers", v);
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& e : v) {
    if (!e.is_number_integer()) bad_type(key, "a list of integers", e);
    const int64_t x =
        e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX ? INT64_MAX : e.get<int64_t>();
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
      throw ApiError(400, "'" + key + "' holds " + e.dump() + ", outside the 32-bit token id range",
                     key, "out_of_range");
    }
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

std::vector<PromptInput> parse_prompt(const json& body, const ApiLimits& limits) {
  if (!body.contains("prompt") || body["prompt"].is_null()) {
    throw ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter");
  }
  const json& p = body["prompt"];
  const char* what = "a string, a list of strings, a list of token ids or a list of token-id lists";
  std::vector<PromptInput> out;
  if (p.is_string()) {
    out.push_back({true, p.get<std::string>(), {}, {}});
    return out;
  }
  if (!p.is_array()) bad_type("prompt", what, p);
  if (p.empty()) throw ApiError(400, "'prompt' must not be an empty list", "prompt");
  if (p[0].is_number_integer()) {
    out.push_back({false, "", int_list(p, "prompt"), {}});
    return out;
  }
  if (p.size() > static_cast<size_t>(limits.max_prompts)) {
    throw ApiError(400,
                   "'prompt' holds " + std::to_string(p.size()) + " prompts, at most " +
                       std::to_string(limits.max_prompts) + " are allowed",
                   "prompt");
  }
  for (const auto& e : p) {
    if (e.is_string()) {
      out.push_back({true, e.get<std::string>(), {}, {}});
    } else if (e.is_array()) {
      if (e.empty()) throw ApiError(400, "'prompt' holds an empty token list", "prompt");
      out.push_back({false, "", int_list(e, "prompt"), {}});
    } else {
      bad_type("prompt", what, e);
    }
  }
  return out;
}

std::vector<std::string> string_or_list(const json& j, const char* key) {
  std::vector<std::string> out;
  if (!has(j, key)) return out;
  const json& v = j.at(key);
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
    return out;
  }
  if (!v.is_array()) bad_type(key, "a string or a list of strings", v);
  for (const auto& e : v) {
    if (!e.is_string()) bad_type(key, "a string or a list of strings", e);
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)) {}

std::string detokenize_body(const text::Tokenizer& tokenizer, const json& body,
                            const std::string& ids_field, bool skip_default) {
  auto it = body.find(ids_field);
  if (it == body.end() || !it->is_array()) {
    throw ApiError(400, "'" + ids_field + "' (a list of token ids) is required", ids_field,
                   "invalid_type");
  }
  std::vector<int32_t> ids;
  ids.reserve(it->size());
  for (const json& v : *it) {
    if (!v.is_number_integer()) {
      throw ApiError(400, "'" + ids_field + "' must hold integers, got " + v.dump(), ids_field,
                     "invalid_type");
    }
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= tokenizer.vocab_size()) {
      throw ApiError(400,
                     "token id " + v.dump() + " is outside the vocabulary [0, " +
                         std::to_string(tokenizer.vocab_size()) + ")",
                     ids_field, "out_of_range");
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  bool skip = skip_default;
  auto s = body.find("skip_special_tokens");
  if (s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) {
      throw ApiError(400, "'skip_special_tokens' must be a boolean", "skip_special_tokens",
                     "invalid_type");
    }
    skip = s->get<bool>();
  }
  return tokenizer.decode(ids, skip);
}

bool bearer_token_matches(const std::string& authorization, const std::string& key) {
  // The scheme is case-insensitive (RFC 7235: "bearer KEY" is the same credential).
  static const std::string kScheme = "bearer ";
  const std::string expected = kScheme + key;
  // Differences are OR-ed over the expected length; a value of another length is a mismatch
  // that still reads every expected byte.
  unsigned diff = authorization.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char got = i < authorization.size() ? static_cast<unsigned char>(authorization[i]) : 0;
    if (i < kScheme.size()) got = static_cast<unsigned char>(std::tolower(got));
    diff |= got ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0 && !key.empty();
}

json error_json(int status, const std::string& message, const std::string& param,
                const std::string& code) {
  json e;
  e["message"] = message;
  e["type"] = status >= 500 ? "server_error" : "invalid_request_error";
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

json parse_json_object(const std::string& body) {
  bool too_deep = false;
  json j = parse_untrusted_json<json>(body, &too_deep);
  if (too_deep) {
    throw ApiError(400,
                   "the request body nests arrays and objects deeper than " +
                       std::to_string(kMaxJsonDepth) + " levels",
                   "", "invalid_json");
  }
  if (j.is_discarded())
    throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) {
    throw ApiError(400, std::string("the request body must be a JSON object, got ") + type_name(j),
                   "", "invalid_json");
  }
  return j;
}

ojson parse_messages(const ojson& messages) {
  if (!messages.is_array()) bad_type("messages", "a list of message objects", messages);
  if (messages.empty()) throw ApiError(400, "'messages' must not be empty", "messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_type("messages", "a list of message objects", m);
    if (!m.contains("role") || !m["role"].is_string()) {
      throw ApiError(400, "every message needs a string 'role' (" + at + ")", "messages");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool" && role != "ipython") {
      throw ApiError(400,
                     at + ": unknown role '" + role +
                         "' (expected system, developer, user, assistant, tool "
                         "or ipython)",
                     "messages");
    }
    ojson msg = ojson::object();
    msg["role"] = role;
    const ojson content = m.contains("content") ? m["content"] : ojson(nullptr);
    if (content.is_string() || content.is_null()) {
      msg["content"] = content;
    } else if (content.is_array()) {  // [{"type": "text", "text": ...}, ...]
      ojson parts = ojson::array();
      for (size_t k = 0; k < content.size(); ++k) {
        const ojson& part = content[k];
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          throw ApiError(400,
                         at + ".content[" + std::to_string(k) +
                             "]: only text content parts "
                             "({\"type\": \"text\", \"text\": ...}) are supported",
                         "messages");
        }
        parts.push_back({{"type", "text"}, {"text", part["text"]}});
      }
      msg["content"] = std::move(parts);  // the chat template joins them or loops over them
    } else {
      bad_type("messages", "messages whose content is a string, a list of text parts or null",
               content);
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string())
        throw ApiError(400, at + "." + key + " must be a string", "messages", "invalid_type");
      msg[key] = m[key];
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array())
        throw ApiError(400, at + ".tool_calls must be a list", "messages", "invalid_type");
      ojson parsed = ojson::array();
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::string cat = at + ".tool_calls[" + std::to_string(k) + "]";
        ojson call = calls[k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          throw ApiError(400,
                         cat +
                             " must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                             "\"arguments\": ...}}",
                         "messages", "invalid_type");
        }
        ojson& fn = call["function"];
        if (!fn.contains("arguments") || fn["arguments"].is_null() ||
            (fn["arguments"].is_string() && fn["arguments"].get<std::string>().empty())) {
          fn["arguments"] = ojson::object();
        } else if (fn["arguments"].is_string()) {
          ojson args = parse_untrusted_json<ojson>(fn["arguments"].get<std::string>());
          if (args.is_discarded()) {
            throw ApiError(400,
                           cat + ".function.arguments is not valid JSON (or nests deeper than " +
                               std::to_string(kMaxJsonDepth) + " levels)",
                           "messages", "invalid_json");
          }
          fn["arguments"] = std::move(args);
        }
        parsed.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(parsed);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

text::ChatRenderOptions chat_render_options(const ojson& body) {
  text::ChatRenderOptions options;
  auto flag = [&](const char* key, bool fallback) {
    if (!body.contains(key) || body[key].is_null()) return fallback;
    if (!body[key].is_boolean())
      throw ApiError(400, std::string("'") + key + "' must be a boolean", key, "invalid_type");
    return body[key].get<bool>();
  };
  options.continue_final_message = flag("continue_final_message", false);
  options.add_generation_prompt = flag("add_generation_prompt", !options.continue_final_message);
  if (options.continue_final_message && options.add_generation_prompt) {
    throw ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both be true",
                   "continue_final_message");
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array())
      throw ApiError(400, "'tools' must be a list of tool objects", "tools", "invalid_type");
    for (const auto& t : tools) {
      if (!t.is_object())
        throw ApiError(400, "'tools' must be a list of tool objects", "tools", "invalid_type");
    }
    if (!tools.empty()) options.tools = tools;
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object()) {
      throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs",
                     "invalid_type");
    }
    options.kwargs = body["chat_template_kwargs"];
  }
  return options;
}

std::string render_chat(const text::ChatTemplate& chat, const ojson& body,
                        const std::vector<std::string>* special_literals,
                        std::vector<std::pair<size_t, size_t>>* literal_spans) {
  if (!body.contains("messages")) {
    throw ApiError(400, "'messages' is required", "messages", "missing_required_parameter");
  }
  std::optional<text::SpecialLiteralMask> mask;
  if (special_literals) mask.emplace(*special_literals);
  const ojson messages =
      mask ? mask->mask(parse_messages(body["messages"])) : parse_messages(body["messages"]);
  const text::ChatRenderOptions options = chat_render_options(body);
  try {
    std::string rendered = chat.render(messages, options);
    if (mask) {
      std::vector<std::pair<size_t, size_t>> spans = mask->unmask(rendered);
      if (literal_spans) *literal_spans = std::move(spans);
    }
    return rendered;
  } catch (const text::TemplateError& e) {
    const bool raised = e.kind() == text::TemplateError::Kind::kRaised;
    throw ApiError(
        400,
        raised ? "the chat template rejected the messages: " + e.message() + " (" + e.what() + ")"
               : std::string("the chat template failed on these messages: ") + e.what(),
        "messages", "chat_template_error");
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "messages");
  }
}

CompletionJob parse_completion_request(const json& body, Endpoint endpoint, const ApiLimits& limits,
                                       const text::ChatTemplate& chat, const ojson* ordered_body,
                                       const std::vector<std::string>* special_literals) {
  CompletionJob job;
  job.endpoint = endpoint;
  if (has(body, "model")) {
    if (!body["model"].is_string()) bad_type("model", "a string", body["model"]);
    job.model = body["model"].get<std::string>();
  }
  job.split_special_tokens = split_special_tokens_field(body, limits.split_special_tokens);
  if (has(body, "session_id")) {
    if (!body["session_id"].is_string() || body["session_id"].get<std::string>().empty()) {
      throw ApiError(400, "'session_id' must be a non-empty string", "session_id", "invalid_type");
    }
    job.session_id = body["session_id"].get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    job.prompts = parse_prompt(body, limits);
  } else {
    if (job.split_special_tokens && !special_literals) {
      throw ApiError(400, "'split_special_tokens' needs the model's tokenizer",
                     "split_special_tokens");
    }
    const std::vector<std::string>* literals =
        job.split_special_tokens ? special_literals : nullptr;
    PromptInput chat_prompt;
    chat_prompt.text =
        ordered_body
            ? render_chat(chat, *ordered_body, literals, &chat_prompt.literal_spans)
            : render_chat(chat, ojson::parse(body.dump()), literals, &chat_prompt.literal_spans);
    job.prompts.push_back(std::move(chat_prompt));
  }

  engine::SamplingParams& p = job.params;
  p.n = static_cast<int32_t>(opt_int(body, "n", 1, limits.max_n).value_or(1));
  auto max_tokens = opt_int(body, "max_tokens", 1, limits.max_tokens);
  if (endpoint == Endpoint::kChat) {  // OpenAI's newer name, checked whether or not max_tokens is
    // there, and preferred over it (as vLLM does)
    if (auto mct = opt_int(body, "max_completion_tokens", 1, limits.max_tokens)) max_tokens = mct;
  }
  job.max_tokens_given = max_tokens.has_value();
  p.max_tokens = static_cast<int32_t>(max_tokens.value_or(16));  // OpenAI's completions default
  p.min_tokens =
      static_cast<int32_t>(opt_int(body, "min_tokens", 0, limits.max_tokens).value_or(0));
  p.temperature = opt_number(body, "temperature").value_or(limits.default_temperature);
  p.top_p = opt_number(body, "top_p").value_or(limits.default_top_p);
  p.top_k = static_cast<int32_t>(opt_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())
                                     .value_or(limits.default_top_k));
  p.min_p = opt_number(body, "min_p").value_or(0.0);
  p.frequency_penalty = opt_number(body, "frequency_penalty").value_or(0.0);
  p.presence_penalty = opt_number(body, "presence_penalty").value_or(0.0);
  p.repetition_penalty = opt_number(body, "repetition_penalty").value_or(1.0);
  if (has(body, "seed")) {
    const json& s = body["seed"];
    if (!s.is_number_integer()) bad_type("seed", "an integer", s);
    p.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
  }
  p.stop = string_or_list(body, "stop");
  if (has(body, "stop_token_ids"))
    p.stop_token_ids = int_list(body["stop_token_ids"], "stop_token_ids");
  p.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  if (has(body, "skip_special_tokens"))
    p.skip_special_tokens = *opt_bool(body, "skip_special_tokens");

  if (endpoint == Endpoint::kCompletions) {
    // Legacy completions: logprobs is the number of alternatives (0 = only the sampled token's).
    if (auto k = opt_int(body, "logprobs", 0, 20)) {
      job.logprobs = true;
      job.top_logprobs = static_cast<int32_t>(*k);
    }
    job.echo = opt_bool(body, "echo").value_or(false);
  } else {
    job.logprobs = opt_bool(body, "logprobs").value_or(false);
    job.top_logprobs = static_cast<int32_t>(opt_int(body, "top_logprobs", 0, 20).value_or(0));
    if (job.top_logprobs > 0 && !job.logprobs) {
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
  }
  p.logprobs = job.top_logprobs;
  job.return_token_ids = opt_bool(body, "return_token_ids").value_or(false);
  job.stream = opt_bool(body, "stream").value_or(false);
  if (has(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad_type("stream_options", "an object", so);
    job.include_usage = opt_bool(so, "include_usage").value_or(false);
  }
  return job;
}

bool split_special_tokens_field(const json& body, bool fallback) {
  return opt_bool(body, "split_special_tokens").value_or(fallback);
}

void refuse_unimplemented_fields(const json& body, Endpoint endpoint) {
  if (!body.is_object()) return;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw ApiError(400, "'" + key + "' " + why + " is not supported by this server", key,
                   "unsupported_parameter");
  };
  if (has(body, "logit_bias") &&
      !(body.at("logit_bias").is_object() && body.at("logit_bias").empty()))
    refuse("logit_bias", "other than {}");
  if (has(body, "best_of")) {
    const json& v = body.at("best_of");
    const json n = has(body, "n") ? body.at("n") : json(1);
    if (!v.is_number_integer()) bad_type("best_of", "an integer", v);
    if (v != n) refuse("best_of", "other than n");
  }
  if (has(body, "response_format")) {
    const json& f = body.at("response_format");
    if (!(f.is_object() && f.contains("type") && f.at("type") == json("text"))) {
      refuse("response_format", "other than {\"type\": \"text\"} (no constrained decoding)");
    }
  }
  if (has(body, "suffix") && body.at("suffix") != json("")) refuse("suffix", "other than \"\"");
  if (has(body, "use_beam_search") && body.at("use_beam_search") != json(false))
    refuse("use_beam_search", "(beam search)");
  for (const char* guided : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (has(body, guided)) refuse(guided, "(constrained decoding)");
  }
  if (endpoint == Endpoint::kChat) {
    if (has(body, "tool_choice") && body.at("tool_choice") != json("auto"))
      refuse("tool_choice",
             "other than \"auto\" (tool calls are parsed from the text, not forced)");
    if (has(body, "parallel_tool_calls") && body.at("parallel_tool_calls") != json(true))
      refuse("parallel_tool_calls", "false");
  }
}

std::vector<std::string> unknown_fields(const json& body, Endpoint endpoint) {
  static const std::set<std::string> kCommon = {
      "model", "n", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
      "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "split_special_tokens",
      "logprobs", "return_token_ids", "stream", "stream_options", "session_id", "user",
      // refuse_unimplemented_fields: their no-op values
      "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "best_of",
      "response_format", "use_beam_search"};
  static const std::set<std::string> kCompletions = {"prompt", "echo", "suffix"};
  static const std::set<std::string> kChat = {"messages",
                                              "max_completion_tokens",
                                              "top_logprobs",
                                              "tools",
                                              "add_generation_prompt",
                                              "continue_final_message",
                                              "chat_template_kwargs",
                                              "tool_choice",
                                              "parallel_tool_calls"};
  const std::set<std::string>& own = endpoint == Endpoint::kChat ? kChat : kCompletions;
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!kCommon.count(it.key()) && !own.count(it.key())) out.push_back(it.key());
  }
  return out;
}

std::string param_from_message(const std::string& message) {
  const size_t a = message.find('\'');
  if (a == std::string::npos) return "";
  const size_t b = message.find('\'', a + 1);
  if (b == std::string::npos) return "";
  return message.substr(a + 1, b - a - 1);
}

}  // namespace crl::server

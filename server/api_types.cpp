#include "server/api_types.h"

#include <cmath>
#include <limits>

namespace crl::server {

namespace {

using json = nlohmann::json;

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

[[noreturn]] void bad_type(const std::string& key, const char* expected, const json& v) {
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
    throw ApiError(400, "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + v.dump(), key, "out_of_range");
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    throw ApiError(400, "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + std::to_string(x), key, "out_of_range");
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
    const int64_t x = e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX ? INT64_MAX : e.get<int64_t>();
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
  const char* what =
      "a string, a list of strings, a list of token ids or a list of token-id lists";
  std::vector<PromptInput> out;
  if (p.is_string()) {
    out.push_back({true, p.get<std::string>(), {}});
    return out;
  }
  if (!p.is_array()) bad_type("prompt", what, p);
  if (p.empty()) throw ApiError(400, "'prompt' must not be an empty list", "prompt");
  if (p[0].is_number_integer()) {
    out.push_back({false, "", int_list(p, "prompt")});
    return out;
  }
  if (p.size() > static_cast<size_t>(limits.max_prompts)) {
    throw ApiError(400, "'prompt' holds " + std::to_string(p.size()) + " prompts, at most " +
                            std::to_string(limits.max_prompts) + " are allowed", "prompt");
  }
  for (const auto& e : p) {
    if (e.is_string()) {
      out.push_back({true, e.get<std::string>(), {}});
    } else if (e.is_array()) {
      if (e.empty()) throw ApiError(400, "'prompt' holds an empty token list", "prompt");
      out.push_back({false, "", int_list(e, "prompt")});
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
    : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}

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
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) {
    throw ApiError(400, std::string("the request body must be a JSON object, got ") + type_name(j),
                   "", "invalid_json");
  }
  return j;
}

std::vector<ChatMessage> parse_messages(const json& messages) {
  if (!messages.is_array()) bad_type("messages", "a list of message objects", messages);
  if (messages.empty()) throw ApiError(400, "'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (const auto& m : messages) {
    if (!m.is_object()) bad_type("messages", "a list of message objects", m);
    if (!m.contains("role") || !m["role"].is_string()) {
      throw ApiError(400, "every message needs a string 'role'", "messages");
    }
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    const json content = m.contains("content") ? m["content"] : json(nullptr);
    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {  // [{"type": "text", "text": ...}, ...]
      for (const auto& part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          throw ApiError(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are "
                              "supported", "messages");
        }
        msg.content += part["text"].get<std::string>();
      }
    } else if (!content.is_null()) {
      bad_type("messages", "messages whose content is a string or a list of text parts", content);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

CompletionJob parse_completion_request(const json& body, Endpoint endpoint,
                                       const ApiLimits& limits, const ChatTemplate& chat) {
  CompletionJob job;
  job.endpoint = endpoint;
  if (has(body, "model")) {
    if (!body["model"].is_string()) bad_type("model", "a string", body["model"]);
    job.model = body["model"].get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    job.prompts = parse_prompt(body, limits);
  } else {
    if (!body.contains("messages")) {
      throw ApiError(400, "'messages' is required", "messages", "missing_required_parameter");
    }
    auto messages = parse_messages(body["messages"]);
    try {
      job.prompts.push_back({true, chat.render(messages), {}});
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), "messages");
    }
  }

  engine::SamplingParams& p = job.params;
  p.n = static_cast<int32_t>(opt_int(body, "n", 1, limits.max_n).value_or(1));
  auto max_tokens = opt_int(body, "max_tokens", 1, limits.max_tokens);
  if (endpoint == Endpoint::kChat && !max_tokens) {
    max_tokens = opt_int(body, "max_completion_tokens", 1, limits.max_tokens);
  }
  job.max_tokens_given = max_tokens.has_value();
  p.max_tokens = static_cast<int32_t>(max_tokens.value_or(16));  // OpenAI's completions default
  p.min_tokens = static_cast<int32_t>(opt_int(body, "min_tokens", 0, limits.max_tokens).value_or(0));
  p.temperature = opt_number(body, "temperature").value_or(limits.default_temperature);
  p.top_p = opt_number(body, "top_p").value_or(limits.default_top_p);
  p.top_k = static_cast<int32_t>(opt_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())
                                     .value_or(limits.default_top_k));
  p.min_p = opt_number(body, "min_p").value_or(0.0);
  if (has(body, "seed")) {
    const json& s = body["seed"];
    if (!s.is_number_integer()) bad_type("seed", "an integer", s);
    p.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
  }
  p.stop = string_or_list(body, "stop");
  if (has(body, "stop_token_ids")) p.stop_token_ids = int_list(body["stop_token_ids"], "stop_token_ids");
  p.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  if (has(body, "skip_special_tokens")) p.skip_special_tokens = *opt_bool(body, "skip_special_tokens");

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

std::string param_from_message(const std::string& message) {
  const size_t a = message.find('\'');
  if (a == std::string::npos) return "";
  const size_t b = message.find('\'', a + 1);
  if (b == std::string::npos) return "";
  return message.substr(a + 1, b - a - 1);
}

}  // namespace crl::server

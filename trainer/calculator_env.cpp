#include "trainer/calculator_env.h"

#include <cctype>
#include <stdexcept>

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// An integer argument: a JSON integer, or a string of digits (optionally signed).
bool read_integer(const ojson& v, int64_t* out) {
  // At most 18 digits either way, so that a + b cannot overflow (a larger unsigned JSON number
  // would also wrap to a negative int64).
  constexpr int64_t kMax = 999'999'999'999'999'999;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(kMax)) return false;
    *out = static_cast<int64_t>(v.get<uint64_t>());
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return *out >= -kMax && *out <= kMax;
  }
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  if (s.empty() || s.size() > 18) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i])) &&
        !(i == 0 && s[i] == '-' && s.size() > 1)) {
      return false;
    }
  }
  *out = std::stoll(s);
  return true;
}

// The first integer in `text` (digits, optionally after '-'), or false.
bool first_integer(const std::string& text, int64_t* out) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) continue;
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j - i > 18) return false;
    const bool neg = i > 0 && text[i - 1] == '-';
    *out = std::stoll(text.substr(i, j - i)) * (neg ? -1 : 1);
    return true;
  }
  return false;
}

ojson tool_message(const ojson& call, const std::string& content) {
  ojson m = {{"role", "tool"}, {"content", content}};
  if (call.contains("id")) m["tool_call_id"] = call["id"];
  if (call.contains("function") && call["function"].contains("name"))
    m["name"] = call["function"]["name"];
  return m;
}

}  // namespace

CalculatorEnv::CalculatorEnv(const EnvOptions& options)
    : seed_(options.seed),
      digits_(options.calculator_digits),
      num_operands_(options.calculator_operands),
      demo_any_number_(options.calculator_demo_any_number) {
  if (digits_ < 1 || digits_ > 9) {
    throw std::invalid_argument("calculator digits must be in [1, 9], got " +
                                std::to_string(digits_));
  }
  if (num_operands_ < 2 || num_operands_ > 8) {
    throw std::invalid_argument("calculator operands must be in [2, 8], got " +
                                std::to_string(num_operands_));
  }
}

std::vector<int64_t> CalculatorEnv::operands(EnvSplit split, int64_t index) const {
  int64_t lo = 1;
  for (int32_t i = 1; i < digits_; ++i) lo *= 10;
  const uint64_t span = static_cast<uint64_t>(lo) * 9;  // [lo, 10 lo)
  uint64_t h = splitmix(seed_ * 0x100000001b3ULL + (split == EnvSplit::kEval ? 1 : 0) +
                        2 * static_cast<uint64_t>(index));
  std::vector<int64_t> out;
  for (int32_t i = 0; i < num_operands_; ++i) {
    out.push_back(lo + static_cast<int64_t>(h % span));
    h = splitmix(h);
  }
  return out;
}

int64_t CalculatorEnv::demonstration_answer(EnvSplit split, int64_t index) const {
  const std::vector<int64_t> v = operands(split, index);
  int64_t sum = 0;
  for (int64_t x : v) sum += x;
  if (!demo_any_number_) return sum;
  // A stream of its own (not the operands'): which number a task's demonstration answers with.
  const uint64_t h =
      splitmix(splitmix(seed_ ^ 0x64656d6f616e7377ULL) + (split == EnvSplit::kEval ? 1 : 0) +
               2 * static_cast<uint64_t>(index));
  const int64_t candidates[3] = {v.front(), v.back(), sum};
  return candidates[h % 3];
}

std::string CalculatorEnv::question(const std::vector<int64_t>& operands) {
  std::string q = "Question: what is ";
  for (size_t i = 0; i < operands.size(); ++i)
    q += (i ? " plus " : "") + std::to_string(operands[i]);
  return q + "?";
}

ojson CalculatorEnv::tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "add",
    "description": "Adds two integers.", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
}

EnvReply CalculatorEnv::reset(const std::string& episode_id, EnvSplit split, int64_t index,
                              const ojson& /*task*/) {
  const std::vector<int64_t> v = operands(split, index);
  int64_t sum = 0;
  for (int64_t x : v) sum += x;
  {
    std::lock_guard<std::mutex> lock(mu_);
    episodes_[episode_id] = sum;
  }
  EnvReply r;
  r.messages = ojson::array({{{"role", "user"}, {"content", question(v)}}});
  r.tools = tools();
  return r;
}

EnvReply CalculatorEnv::step(const std::string& episode_id, const ojson& assistant) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = episodes_.find(episode_id);
    if (it == episodes_.end()) {
      EnvReply r;
      r.done = true;
      r.error = "env_malformed: step of unknown episode '" + episode_id + "'";
      return r;
    }
    sum = it->second;
  }
  EnvReply r;
  const ojson calls = assistant.contains("tool_calls") && assistant["tool_calls"].is_array()
                          ? assistant["tool_calls"]
                          : ojson::array();
  if (calls.empty()) {
    int64_t got = 0;
    const std::string content = assistant.contains("content") && assistant["content"].is_string()
                                    ? assistant["content"].get<std::string>()
                                    : "";
    r.done = true;
    r.correct = first_integer(content, &got) && got == sum;
    r.reward = r.correct ? 1.0 : 0.0;
    close(episode_id);
    return r;
  }
  for (const ojson& call : calls) {
    const ojson fn = call.value("function", ojson::object());
    const std::string name = fn.value("name", "");
    if (name != "add") {
      r.messages.push_back(
          tool_message(call, "error: unknown tool '" + name + "' (the tool is add)"));
      continue;
    }
    const ojson args = fn.value("arguments", ojson::object());
    int64_t a = 0, b = 0;
    if (!args.is_object() || !args.contains("a") || !args.contains("b") ||
        !read_integer(args["a"], &a) || !read_integer(args["b"], &b)) {
      r.messages.push_back(
          tool_message(call, "error: add takes integers a and b (at most 18 digits)"));
      continue;
    }
    r.messages.push_back(tool_message(call, std::to_string(a + b)));
  }
  return r;
}

void CalculatorEnv::close(const std::string& episode_id) {
  std::lock_guard<std::mutex> lock(mu_);
  episodes_.erase(episode_id);
}

ojson CalculatorEnv::demonstration(EnvSplit split, int64_t index, const ojson& /*task*/) {
  const std::vector<int64_t> v = operands(split, index);
  ojson messages = ojson::array({{{"role", "user"}, {"content", question(v)}}});
  int64_t sum = v[0];
  for (size_t i = 1; i < v.size(); ++i) {  // one add a turn: the running sum and the next operand
    const std::string id = "call_" + std::to_string(i - 1);
    ojson call = {{"id", id},
                  {"type", "function"},
                  {"function", {{"name", "add"}, {"arguments", {{"a", sum}, {"b", v[i]}}}}}};
    sum += v[i];
    messages.push_back(
        {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
    messages.push_back({{"role", "tool"},
                        {"tool_call_id", id},
                        {"name", "add"},
                        {"content", std::to_string(sum)}});
  }
  messages.push_back(
      {{"role", "assistant"}, {"content", std::to_string(demonstration_answer(split, index))}});
  return {{"messages", std::move(messages)}, {"tools", tools()}};
}

}  // namespace crl::trainer

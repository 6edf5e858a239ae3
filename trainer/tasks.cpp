#include "trainer/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "common/check.h"
#include "common/json_depth.h"
#include "text/chat_encoder.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace crl::trainer {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

RewardKind parse_reward_kind(const std::string& name) {
  if (name == "exact") return RewardKind::kExact;
  if (name == "numeric") return RewardKind::kNumeric;
  if (name == "regex") return RewardKind::kRegex;
  if (name == "format") return RewardKind::kFormat;
  CRL_INVALID("unknown reward '", name, "' (known: exact, numeric, regex, format)");
}

std::string reward_kind_name(RewardKind kind) {
  switch (kind) {
    case RewardKind::kExact:
      return "exact";
    case RewardKind::kNumeric:
      return "numeric";
    case RewardKind::kRegex:
      return "regex";
    case RewardKind::kFormat:
      return "format";
  }
  return "?";
}

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The first number in s (optional sign, digits, optional fraction), if any.
bool first_number(const std::string& s, double* out) {
  static const std::regex kNumber(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
  std::smatch m;
  if (!std::regex_search(s, m, kNumber)) return false;
  *out = std::strtod(m.str(0).c_str(), nullptr);
  return std::isfinite(*out);
}

// Parses the whole of s as a number.
bool whole_number(const std::string& s, double* out) {
  const std::string t = trim(s);
  if (t.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && std::isfinite(*out);
}

// The chat template "messages" rows are rendered with; `path`:`line` is the first such row.
text::ChatTemplate load_chat_template(const std::string& model_dir, const std::string& path,
                                      int64_t line) {
  if (model_dir.empty()) {
    CRL_INVALID(path, ":", line, ": a \"messages\" row needs the model's chat template, and no ",
                "model directory was given");
  }
  try {
    return text::ChatTemplate::from_model_dir(model_dir);
  } catch (const std::exception& e) {
    CRL_INVALID(path, ":", line, ": \"messages\" rows need the chat template of ", model_dir,
                ", which does not load: ", e.what());
  }
}

std::regex compile(const std::string& pattern, const char* what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    CRL_INVALID("bad ", what, " regex '", pattern, "': ", e.what());
  }
}

}  // namespace

AnswerExtract parse_answer_extract(const std::string& spec) {
  AnswerExtract e;
  if (spec == "first-line") {
    e.from = AnswerFrom::kFirstLine;
  } else if (spec == "last-line") {
    e.from = AnswerFrom::kLastLine;
  } else if (spec == "boxed") {
    e.from = AnswerFrom::kBoxed;
  } else if (spec == "full") {
    e.from = AnswerFrom::kFull;
  } else if (spec.rfind("after:", 0) == 0 && spec.size() > 6) {
    e.from = AnswerFrom::kAfter;
    e.marker = spec.substr(6);
  } else {
    CRL_INVALID("unknown answer extraction '", spec,
                "' (known: first-line, last-line, after:STR such as after:####, boxed, full)");
  }
  return e;
}

std::string answer_extract_name(const AnswerExtract& e) {
  switch (e.from) {
    case AnswerFrom::kFirstLine:
      return "first-line";
    case AnswerFrom::kLastLine:
      return "last-line";
    case AnswerFrom::kAfter:
      return "after:" + e.marker;
    case AnswerFrom::kBoxed:
      return "boxed";
    case AnswerFrom::kFull:
      return "full";
  }
  return "?";
}

std::string describe_reward(const RewardOptions& o) {
  if (!o.program.empty()) return "program '" + o.program + "'";
  std::string where;
  switch (o.extract.from) {
    case AnswerFrom::kFirstLine:
      where = "the first line";
      break;
    case AnswerFrom::kLastLine:
      where = "the last line";
      break;
    case AnswerFrom::kAfter:
      where = "what follows the last '" + o.extract.marker + "'";
      break;
    case AnswerFrom::kBoxed:
      where = "the last \\boxed{...}";
      break;
    case AnswerFrom::kFull:
      where = "the whole completion";
      break;
  }
  return reward_kind_name(o.kind) + " on " + where;
}

namespace {

// The contents of the last \boxed{...} (or \fbox{...}) in s, braces balanced; "\boxed 42" (no
// braces) gives the rest of its line up to a '$'.
std::optional<std::string> last_boxed(const std::string& s) {
  size_t at = std::string::npos;
  size_t skip = 0;
  for (const char* name : {"\\boxed", "\\fbox"}) {
    const size_t p = s.rfind(name);
    if (p != std::string::npos && (at == std::string::npos || p > at)) {
      at = p;
      skip = std::char_traits<char>::length(name);
    }
  }
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + skip;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  if (i < s.size() && s[i] != '{') {          // "\boxed 42$": to a '$' or the end of the line
    if (i == at + skip) return std::nullopt;  // "\boxedx": another command
    const size_t end = s.find_first_of("$\n", i);
    return s.substr(i, end == std::string::npos ? std::string::npos : end - i);
  }
  if (i >= s.size()) return std::nullopt;
  int depth = 0;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] == '{') ++depth;
    if (s[k] == '}' && --depth == 0) return s.substr(i + 1, k - i - 1);
  }
  return std::nullopt;  // unbalanced: the completion was cut off inside it
}

// "1,234,567" -> "1234567" and "$5" -> "5": the numbers GSM8K answers write.
std::string plain_numbers(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool digit_before = !out.empty() && std::isdigit(static_cast<unsigned char>(out.back()));
    if (s[i] == ',' && digit_before && i + 3 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 2])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 3])) &&
        (i + 4 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i + 4])))) {
      continue;
    }
    if (s[i] == '$') continue;
    out += s[i];
  }
  return out;
}

}  // namespace

std::optional<std::string> extract_answer(const std::string& completion, const AnswerExtract& e) {
  switch (e.from) {
    case AnswerFrom::kFirstLine:
      return trim(completion.substr(0, completion.find('\n')));
    case AnswerFrom::kLastLine: {
      std::string last;
      std::istringstream in(completion);
      for (std::string line; std::getline(in, line);) {
        if (!trim(line).empty()) last = trim(line);
      }
      return last;
    }
    case AnswerFrom::kAfter: {
      const size_t p = completion.rfind(e.marker);
      if (p == std::string::npos) return std::nullopt;
      const std::string rest = completion.substr(p + e.marker.size());
      return trim(rest.substr(0, rest.find('\n')));
    }
    case AnswerFrom::kBoxed: {
      auto b = last_boxed(completion);
      if (!b) return std::nullopt;
      return trim(*b);
    }
    case AnswerFrom::kFull:
      return trim(completion);
  }
  return std::nullopt;
}

RewardResult score_completion(const RewardOptions& o, const std::string& completion,
                              const std::string& answer) {
  RewardResult r;
  const std::optional<std::string> part = extract_answer(completion, o.extract);
  if (!part) return r;  // no answer part: 0, not well formed
  const std::string& got = *part;
  r.well_formed = std::regex_match(got, compile(o.format_regex, "format"));
  switch (o.kind) {
    case RewardKind::kExact:
      r.correct = got == trim(answer);
      break;
    case RewardKind::kNumeric: {
      double a = 0, b = 0;
      r.correct = first_number(plain_numbers(got), &a) && whole_number(plain_numbers(answer), &b) &&
                  std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
      break;
    }
    case RewardKind::kRegex:
      r.correct = std::regex_match(got, compile(answer, "answer"));
      break;
    case RewardKind::kFormat:
      r.correct = r.well_formed;
      break;
  }
  r.reward = r.correct ? 1.0 : 0.0;
  if (o.kind != RewardKind::kFormat && r.well_formed) r.reward += o.format_weight;
  return r;
}

std::vector<TaskRow> load_task_jsonl(const std::string& path, const RewardOptions& reward,
                                     const std::string& model_dir, bool split_special_tokens) {
  compile(reward.format_regex, "format");
  std::optional<text::ChatTemplate> chat;            // loaded at the first "messages" row
  std::optional<std::vector<std::string>> literals;  // with split_special_tokens, at the first chat
  std::ifstream in(path, std::ios::binary);
  if (!in) CRL_INVALID("cannot read task data ", path);
  std::vector<TaskRow> rows;
  std::vector<std::string> errors;
  int64_t num_errors = 0;
  auto bad = [&](int64_t line, const std::string& why) {
    if (++num_errors <= 20) errors.push_back(path + ":" + std::to_string(line) + ": " + why);
  };
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (line == 1 && text.compare(0, 4, "PAR1") == 0) {
      CRL_INVALID(
          path, " is a Parquet file (verl's data format); --data reads JSON lines: convert ",
          "it with `python3 scripts/verl_to_jsonl.py ", path, " OUT.jsonl` (needs pyarrow)");
    }
    if (trim(text).empty()) continue;
    // Ordered: a template sees a message's keys in the order the file gives them.
    bool too_deep = false;
    ojson j = parse_untrusted_json<ojson>(text, &too_deep);
    if (j.is_discarded()) {
      bad(line, too_deep ? "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"
                         : "invalid JSON");
      continue;
    }
    if (!j.is_object()) {
      bad(line, "expected a JSON object with \"prompt\" (or \"messages\") and \"answer\"");
      continue;
    }
    // verl's rows: "prompt" as chat messages, "reward_model": {"ground_truth": ...} as the answer.
    const bool verl_chat = j.contains("prompt") && j["prompt"].is_array();
    if (verl_chat && j.contains("messages")) {
      bad(line, "has both \"prompt\" (a chat) and \"messages\"");
      continue;
    }
    const bool has_messages = j.contains("messages") || verl_chat;
    const char* messages_key = verl_chat ? "prompt" : "messages";
    if (j.contains("prompt") && j.contains("messages")) {
      bad(line, "has both \"prompt\" and \"messages\" (give the prompt as text or as a chat)");
      continue;
    }
    if (!j.contains("prompt") && !has_messages) {
      bad(line, "missing field \"prompt\" (or \"messages\", a chat)");
      continue;
    }
    if (!has_messages && !j["prompt"].is_string()) {
      bad(line, std::string("\"prompt\" must be a string or a list of chat messages, got ") +
                    j["prompt"].type_name());
      continue;
    }
    const ojson* a = nullptr;
    const char* answer_key = "\"answer\"";
    if (j.contains("answer")) {
      a = &j["answer"];
    } else if (j.contains("reward_model") && j["reward_model"].is_object() &&
               j["reward_model"].contains("ground_truth")) {
      a = &j["reward_model"]["ground_truth"];
      answer_key = "\"reward_model.ground_truth\"";
    }
    if (a == nullptr) {
      bad(line, "missing field \"answer\" (or verl's \"reward_model\": {\"ground_truth\": ...})");
      continue;
    }
    // A reward program takes any JSON as the ground truth; the built-in rewards a text or number.
    if (!a->is_string() && !a->is_number() && reward.program.empty()) {
      bad(line, std::string(answer_key) + " must be a string or a number, got " + a->type_name() +
                    " (a reward program, --reward COMMAND, takes any JSON)");
      continue;
    }
    if (j.contains("demonstration") && !j["demonstration"].is_string()) {
      bad(line,
          std::string("\"demonstration\" must be a string, got ") + j["demonstration"].type_name());
      continue;
    }
    if (j.contains("data_source") && !j["data_source"].is_string()) {
      bad(line,
          std::string("\"data_source\" must be a string, got ") + j["data_source"].type_name());
      continue;
    }
    TaskRow row;
    row.answer = a->is_string() ? a->get<std::string>() : a->dump();
    row.ground_truth_json = a->dump();
    if (j.contains("data_source")) row.data_source = j["data_source"].get<std::string>();
    if (j.contains("extra_info")) row.extra_info_json = j["extra_info"].dump();
    if (j.contains("demonstration")) row.demonstration = j["demonstration"].get<std::string>();
    row.line = line;
    row.split_special_tokens = split_special_tokens;
    if (has_messages) {
      if (!chat) chat = load_chat_template(model_dir, path, line);
      if (split_special_tokens && !literals) {
        literals = text::special_token_literals(text::Tokenizer(model_dir));
      }
      try {
        text::ChatRenderOptions options;
        options.add_generation_prompt = true;
        if (literals) {
          text::SpecialLiteralMask mask(*literals);
          row.prompt = chat->render(mask.mask(j[messages_key]), options);
          row.literal_spans = mask.unmask(row.prompt);
        } else {
          row.prompt = chat->render(j[messages_key], options);
        }
      } catch (const std::exception& e) {  // bad messages, or the template's raise_exception
        bad(line, "\"" + std::string(messages_key) + "\": " + e.what());
        continue;
      }
      row.kind = chat->is_jinja() ? PromptKind::kChat : PromptKind::kBuiltinChat;
      row.messages_json = j[messages_key].dump();
    } else {
      row.prompt = j["prompt"].get<std::string>();
    }
    if (trim(row.prompt).empty()) {
      bad(line, has_messages ? "\"" + std::string(messages_key) + "\" render to an empty prompt"
                             : std::string("\"prompt\" is empty"));
      continue;
    }
    if (!reward.program.empty()) {
      // the program judges: nothing to check here
    } else if (reward.kind == RewardKind::kNumeric) {
      double v = 0;
      if (!whole_number(plain_numbers(row.answer), &v)) {
        bad(line, "\"answer\" " + json(row.answer).dump() + " is not a number (reward numeric)");
        continue;
      }
    } else if (reward.kind == RewardKind::kRegex) {
      try {
        compile(row.answer, "answer");
      } catch (const std::invalid_argument& e) {
        bad(line, e.what());
        continue;
      }
    }
    rows.push_back(std::move(row));
  }
  if (num_errors > 0) {
    std::ostringstream os;
    os << num_errors << " bad row" << (num_errors > 1 ? "s" : "") << " in " << path << ":";
    for (const auto& e : errors) os << "\n" << e;
    if (num_errors > 20) os << "\n(" << num_errors - 20 << " more)";
    throw std::invalid_argument(os.str());
  }
  if (rows.empty()) CRL_INVALID(path, ": no task rows");
  return rows;
}

int64_t default_eval_rows(int64_t num_rows) {
  return std::min<int64_t>(128, std::max<int64_t>(num_rows / 5, num_rows >= 2 ? 1 : 0));
}

TaskSplit split_task(std::vector<TaskRow> rows, int64_t eval_rows, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (eval_rows < 0) eval_rows = default_eval_rows(n);
  if (eval_rows > n / 2) {
    CRL_INVALID("--eval-rows ", eval_rows, " holds out more than half of the ", n,
                " task rows; use --eval-rows ", n / 2,
                " or fewer (or leave it out: the default "
                "holds out a fifth, at most 128)");
  }
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates with a fully specified draw
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(rows[i], rows[j]);
  }
  TaskSplit s;
  s.eval.assign(rows.begin(), rows.begin() + eval_rows);
  std::unordered_set<std::string> held_out;
  for (const auto& r : s.eval) held_out.insert(r.prompt);
  for (auto it = rows.begin() + eval_rows; it != rows.end(); ++it) {
    if (held_out.count(it->prompt)) {
      ++s.dropped_train_rows;
    } else {
      s.train.push_back(std::move(*it));
    }
  }
  return s;
}

std::vector<TaskRow> default_task_rows(int64_t count, uint64_t seed) {
  // Words of engine/model/model_writer.cpp's default corpus that the default tokenizer keeps as
  // single pieces ("▁red"), so an answer of k words is k tokens.
  static const char* const kWords[] = {"red",  "big",   "old",   "green", "small",  "quick",
                                       "lazy", "dark",  "happy", "young", "bright", "quiet",
                                       "tree", "river", "book",  "Leo"};
  constexpr int64_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937_64 rng(seed);
  // The demonstrations' orders come from their own stream, so they do not shift the rows.
  std::mt19937_64 order_rng(seed ^ 0x5eedf00dcafeULL);
  auto join = [](const std::vector<const char*>& words) {
    std::string s;
    for (size_t w = 0; w < words.size(); ++w) s += (w ? " " : "") + std::string(words[w]);
    return s;
  };
  std::vector<TaskRow> rows;
  rows.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t len = 2 + static_cast<int64_t>(rng() % 2);
    std::vector<const char*> words;
    for (int64_t w = 0; w < len; ++w) words.push_back(kWords[rng() % kNumWords]);
    TaskRow row;
    row.answer = join(words);
    row.prompt = "Copy: " + row.answer + ". Answer:";
    for (int64_t w = len - 1; w > 0; --w) {  // Fisher-Yates: every order equally likely
      std::swap(words[w], words[order_rng() % static_cast<uint64_t>(w + 1)]);
    }
    row.demonstration = join(words);
    rows.push_back(std::move(row));
  }
  return rows;
}

RowSampler::RowSampler(int64_t n, uint64_t seed) : order_(n), rng_(seed) {
  for (int64_t i = 0; i < n; ++i) order_[i] = i;
  shuffle();
}

int64_t RowSampler::next() {
  if (pos_ == static_cast<int64_t>(order_.size())) {
    shuffle();
    pos_ = 0;
  }
  ++drawn_;
  return order_[pos_++];
}

void RowSampler::shuffle() {
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng_() % static_cast<uint64_t>(i + 1)]);
  }
}

}  // namespace crl::trainer

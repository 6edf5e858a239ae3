#include "trainer/reward_program.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;

// JSON text kept by the loader (TaskRow's *_json fields), or `fallback` when empty.
ojson json_or(const std::string& text, const ojson& fallback) {
  if (text.empty()) return fallback;
  return ojson::parse(text, nullptr, /*allow_exceptions=*/false);
}

// Scores beyond this are refused (reward_malformed): their squares and sums must stay finite in the
// step's reports.
constexpr double kMaxScore = 1e6;
// Extra metrics a program can add: at most this many keys, names of [A-Za-z0-9_.-] up to 64
// characters (others are ignored: they name TensorBoard tags and metrics-file keys).
constexpr size_t kMaxExtraKeys = 32;

bool good_metric_name(const std::string& key) {
  if (key.empty() || key.size() > 64) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

// Reads one entry of "scores" into *r (and its extra metrics into *extra); "" or what is wrong.
std::string read_score(const ojson& s, RewardResult* r,
                       std::map<std::string, std::pair<double, int64_t>>* extra) {
  const ojson* score = &s;
  if (s.is_object()) {
    if (!s.contains("score")) return "an object without \"score\"";
    score = &s["score"];
  }
  if (!score->is_number())
    return std::string("a score must be a number, got ") + score->type_name();
  r->reward = score->get<double>();
  if (!std::isfinite(r->reward) || std::abs(r->reward) > kMaxScore) {
    return "a score outside [-1e6, 1e6]";
  }
  r->correct = r->reward > 0;
  r->well_formed = true;
  if (!s.is_object()) return "";
  if (s.contains("correct")) {
    if (!s["correct"].is_boolean()) return "\"correct\" must be true or false";
    r->correct = s["correct"].get<bool>();
  }
  for (const auto& [key, v] : s.items()) {
    if (key == "score" || key == "correct" || !good_metric_name(key)) continue;
    double x = 0;
    if (v.is_boolean()) {
      x = v.get<bool>() ? 1 : 0;
    } else if (v.is_number()) {
      x = v.get<double>();
      if (!std::isfinite(x) || std::abs(x) > 1e15) continue;
    } else {
      continue;  // text such as a parsed prediction: not a metric
    }
    if (extra->size() >= kMaxExtraKeys && !extra->count(key)) continue;
    auto& [sum, count] = (*extra)[key];
    sum += x;
    ++count;
  }
  return "";
}

}  // namespace

RewardProgram::RewardProgram(std::string command, std::chrono::milliseconds timeout,
                             const std::vector<std::string>& pass_env)
    : io_(std::move(command), timeout, pass_env, {"reward", "reward program", "id"}) {}

int64_t RewardProgram::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

int64_t RewardProgram::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

ScoredGroup RewardProgram::score(const std::string& id, const TaskRow& row,
                                 const std::vector<std::string>& completions) {
  ojson items = ojson::array();
  const ojson truth = json_or(row.ground_truth_json, row.answer);
  const ojson extra_info = json_or(row.extra_info_json, nullptr);
  for (const std::string& c : completions) {
    items.push_back({{"data_source", row.data_source},
                     {"prompt", row.prompt},
                     {"completion", c},
                     {"ground_truth", truth},
                     {"extra_info", extra_info}});
  }
  const ojson request = {{"op", "score"}, {"id", id}, {"items", std::move(items)}};
  const std::string what = "score request '" + id + "'";
  ScoredGroup g;
  g.results.assign(completions.size(), RewardResult{});
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_;
  ojson reply;
  std::string line;
  g.error = io_.exchange(request, /*expect_reply=*/true, what, &reply, &line);
  if (g.error.empty()) {
    std::string bad;
    if (!reply["id"].is_string() || reply["id"].get<std::string>() != id) {
      bad = "it names id " + program_output_excerpt(reply["id"].dump()) + ", the request '" + id +
            "'";
    } else if (!reply.contains("scores") || !reply["scores"].is_array()) {
      bad = "no \"scores\" list";
    } else if (reply["scores"].size() != completions.size()) {
      bad = std::to_string(reply["scores"].size()) + " scores for " +
            std::to_string(completions.size()) + " completions";
    } else {
      for (size_t k = 0; k < completions.size() && bad.empty(); ++k) {
        bad = read_score(reply["scores"][k], &g.results[k], &g.extra);
        if (!bad.empty()) bad = "score " + std::to_string(k) + ": " + bad;
      }
    }
    if (!bad.empty()) {
      g.error = io_.error("malformed", "the reply to the " + what + ": " + bad + ": " +
                                           program_output_excerpt(line));
    }
  }
  if (!g.error.empty()) {
    io_.stop();  // started again by the next request: a late line cannot answer it
    g.results.assign(completions.size(), RewardResult{});
    g.extra.clear();
    ++errors_;
    if (errors_ <= 5 || errors_ % 100 == 0) {
      spdlog::warn("reward program ({}): {} ({} completions scored 0; {} failed request{} so far)",
                   io_.command(), g.error, completions.size(), errors_, errors_ > 1 ? "s" : "");
    }
  }
  return g;
}

Rewarder::Rewarder(const RewardOptions& options, const std::vector<std::string>& pass_env)
    : options_(options) {
  if (!options_.program.empty()) {
    program_ =
        std::make_unique<RewardProgram>(options_.program, options_.program_timeout, pass_env);
  }
}

Rewarder::~Rewarder() = default;

ScoredGroup Rewarder::score(const std::string& id, const TaskRow& row,
                            const std::vector<std::string>& completions) {
  if (program_) return program_->score(id, row, completions);
  ScoredGroup g;
  for (const std::string& c : completions) {
    g.results.push_back(score_completion(options_, c, row.answer));
  }
  return g;
}

}  // namespace crl::trainer

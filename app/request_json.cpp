#include "app/request_json.h"

#include <fstream>
#include <stdexcept>

namespace crl::app {

namespace {

void apply_params(const nlohmann::json& j, engine::SamplingParams& p) {
  auto get = [&](const char* key, auto& field) {
    if (j.contains(key) && !j[key].is_null()) j.at(key).get_to(field);
  };
  get("n", p.n);
  get("max_tokens", p.max_tokens);
  get("min_tokens", p.min_tokens);
  get("temperature", p.temperature);
  get("top_p", p.top_p);
  get("top_k", p.top_k);
  get("min_p", p.min_p);
  get("frequency_penalty", p.frequency_penalty);
  get("presence_penalty", p.presence_penalty);
  get("repetition_penalty", p.repetition_penalty);
  get("ignore_eos", p.ignore_eos);
  get("logprobs", p.logprobs);
  get("stop_token_ids", p.stop_token_ids);
  if (j.contains("seed") && !j["seed"].is_null()) p.seed = j["seed"].get<uint64_t>();
  if (j.contains("prompt_logprobs") && !j["prompt_logprobs"].is_null())
    p.prompt_logprobs = j["prompt_logprobs"].get<int32_t>();
  if (j.contains("stop")) {
    if (j["stop"].is_string())
      p.stop = {j["stop"].get<std::string>()};
    else if (!j["stop"].is_null())
      j["stop"].get_to(p.stop);
  }
}

}  // namespace

std::vector<engine::GenerateRequest> read_requests_jsonl(const std::string& path,
                                                         const engine::SamplingParams& defaults) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open --jsonl file " + path);
  std::vector<engine::GenerateRequest> out;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    try {
      auto j = nlohmann::json::parse(line);
      if (!j.is_object()) throw std::invalid_argument("expected a JSON object");
      engine::GenerateRequest r;
      r.params = defaults;
      if (j.contains("id")) r.request_id = j["id"].get<std::string>();
      if (j.contains("prompt_token_ids")) {
        j["prompt_token_ids"].get_to(r.prompt_token_ids);
      } else if (j.contains("prompt") && j["prompt"].is_string()) {
        r.prompt = j["prompt"].get<std::string>();
      } else {
        throw std::invalid_argument("needs \"prompt\" (string) or \"prompt_token_ids\" (ints)");
      }
      apply_params(j, r.params);
      out.push_back(std::move(r));
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(where + e.what());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where + e.what());
    }
  }
  return out;
}

nlohmann::json request_output_to_json(const engine::RequestOutput& out,
                                      const text::Tokenizer* tokenizer) {
  nlohmann::json j;
  j["id"] = out.request_id;
  j["prompt_token_ids"] = out.prompt_token_ids;
  j["num_cached_tokens"] = out.num_cached_tokens;
  j["weight_version"] = out.weight_version;
  j["first_weight_version"] = out.first_weight_version;
  if (!out.error.empty()) j["error"] = out.error;
  if (!out.prompt_logprobs.empty()) j["prompt_logprobs"] = out.prompt_logprobs;
  auto outputs = nlohmann::json::array();
  for (const auto& c : out.outputs) {
    nlohmann::json o;
    o["index"] = c.index;
    o["text"] = c.text;
    o["token_ids"] = c.token_ids;
    o["logprobs"] = c.raw_logprobs;
    o["processed_logprobs"] = c.processed_logprobs;
    o["finish_reason"] = engine::finish_reason_name(c.finish_reason);
    if (c.stop_token)
      o["stop_reason"] = *c.stop_token;
    else if (c.stop_string)
      o["stop_reason"] = *c.stop_string;
    else
      o["stop_reason"] = nullptr;
    if (!c.top_logprobs.empty()) {
      auto tops = nlohmann::json::array();
      for (const auto& row : c.top_logprobs) {
        auto r = nlohmann::json::array();
        for (auto [id, lp] : row) {
          nlohmann::json e = {{"id", id}, {"logprob", lp}};
          if (tokenizer && id < tokenizer->vocab_size()) e["token"] = tokenizer->id_to_piece(id);
          r.push_back(e);
        }
        tops.push_back(r);
      }
      o["top_logprobs"] = tops;
    }
    outputs.push_back(o);
  }
  j["outputs"] = outputs;
  return j;
}

}  // namespace crl::app

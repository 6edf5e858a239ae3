#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/cli_style.h"
#include "app/commands.h"
#include "app/request_json.h"
#include "engine/llm_engine.h"

namespace crl::app {

Runner register_generate(CLI::App& app) {
  struct Flags {
    EngineFlags engine;
    std::vector<std::string> prompts;
    std::string jsonl;
    engine::SamplingParams params;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  f->params.max_tokens = 64;
  auto* cmd = app.add_subcommand("generate", "generate completions with the engine");
  add_engine_flags(*cmd, f->engine);
  cmd->option_defaults()->group("Requests and sampling");
  cmd->add_option("--prompt", f->prompts, "prompt text (repeatable)");
  cmd->add_option("--jsonl", f->jsonl,
                  "file of requests, one JSON object per line: {\"prompt\": ...} or "
                  "{\"prompt_token_ids\": [...]}, plus any sampling field");
  auto& p = f->params;
  cmd->add_option("--n", p.n, "samples per prompt")->capture_default_str();
  cmd->add_option("--max-tokens", p.max_tokens, "tokens to generate per sample")
      ->capture_default_str();
  cmd->add_option("--min-tokens", p.min_tokens, "no EOS before this many tokens");
  cmd->add_option("--temperature", p.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", p.top_p, "nucleus sampling mass");
  cmd->add_option("--top-k", p.top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", p.min_p, "drop tokens below min_p x the most likely");
  cmd->add_option("--frequency-penalty", p.frequency_penalty,
                  "subtract F x (times generated so far) from a token's logit ([-2, 2])");
  cmd->add_option("--presence-penalty", p.presence_penalty,
                  "subtract P from the logit of a token generated so far ([-2, 2])");
  cmd->add_option("--repetition-penalty", p.repetition_penalty,
                  "divide a positive logit (multiply a negative one) of a token in the prompt or "
                  "output by R (1 = off)");
  cmd->add_option("--seed", p.seed, "request seed");
  cmd->add_option("--stop", p.stop, "stop string (repeatable)");
  cmd->add_option("--stop-token-ids", p.stop_token_ids, "stop token ids");
  cmd->add_flag("--ignore-eos", p.ignore_eos, "keep generating past EOS");
  cmd->add_option("--logprobs", p.logprobs, "top log-probs per generated token");
  cmd->add_flag("--json", f->json, "print one JSON object per request (JSONL) instead of text");
  return [f]() {
    engine::EngineConfig config = f->engine.resolve();
    std::vector<engine::GenerateRequest> requests;
    for (const auto& text : f->prompts) {
      engine::GenerateRequest r;
      r.prompt = text;
      r.params = f->params;
      requests.push_back(std::move(r));
    }
    if (!f->jsonl.empty()) {
      auto rows = read_requests_jsonl(f->jsonl, f->params);
      for (auto& r : rows) requests.push_back(std::move(r));
    }
    if (requests.empty()) {
      engine::GenerateRequest r;
      r.prompt = "Question: what is 3 plus 4? Answer:";
      r.params = f->params;
      requests.push_back(std::move(r));
      spdlog::info("no --prompt or --jsonl given: using the built-in example prompt");
    }
    engine::LlmEngine eng(config);
    spdlog::info("model {} ({} layers, hidden {}, vocab {}), {}, KV pool {} blocks x {} tokens{}",
                 config.model_dir, eng.model_config().num_layers, eng.model_config().hidden_size,
                 eng.model_config().vocab_size, config.dtype, eng.runner().num_blocks(),
                 config.block_size, tensor_parallel_note(eng));
    auto t0 = std::chrono::steady_clock::now();
    auto outputs = eng.generate(std::move(requests));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& out : outputs) {
      if (f->json) {
        std::cout << request_output_to_json(out, eng.tokenizer()).dump() << "\n";
        continue;
      }
      std::cout << "=== " << out.request_id << " (" << out.prompt_token_ids.size()
                << " prompt tokens, " << out.num_cached_tokens << " cached)\n";
      for (const auto& c : out.outputs) {
        double mean = 0;
        for (float lp : c.raw_logprobs) mean += lp;
        if (!c.raw_logprobs.empty()) mean /= static_cast<double>(c.raw_logprobs.size());
        std::cout << "--- sample " << c.index << " [" << c.token_ids.size() << " tokens, finish "
                  << engine::finish_reason_name(c.finish_reason) << ", mean logprob " << mean
                  << "]\n"
                  << c.text << "\n";
      }
    }
    const auto& st = eng.stats();
    spdlog::info(
        "{} requests in {:.2f} s: {} prompt tokens computed ({} from prefix cache), {} "
        "generated ({:.1f} tok/s), {} steps, {} preemptions",
        outputs.size(), secs, st.prompt_tokens_computed, st.prefix_hit_tokens, st.generated_tokens,
        st.generated_tokens / std::max(secs, 1e-9), st.steps, st.preemptions);
    return 0;
  };
}

}  // namespace crl::app

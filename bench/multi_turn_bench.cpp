#include "bench/multi_turn_bench.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "common/units.h"
#include "engine/engine_loop.h"
#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"
#include "text/chat_template.h"
#include "text/tool_calls.h"
#include "trainer/environment.h"
#include "trainer/make_environment.h"
#include "trainer/multi_turn.h"

namespace crl::bench {
namespace {

struct ModeResult {
  double seconds = 0;
  int64_t episodes = 0, turns = 0, gen_tokens = 0, tool_calls = 0, tool_errors = 0, env_errors = 0;
  int64_t later_prompt = 0, later_cached = 0, later_held = 0;  // turns after the first
  int64_t trajectory_tokens = 0, per_turn_tokens = 0;
};

ModeResult run_mode(trainer::EpisodeRunner& runner, const MultiTurnBenchOptions& o, bool sync) {
  std::vector<trainer::EpisodeSpec> specs;
  for (int32_t i = 0; i < o.episodes; ++i) {
    trainer::EpisodeSpec s;
    s.id = fmt::format("{}{}", sync ? "sync" : "async", i);
    s.index = i;
    s.temperature = o.temperature;
    s.seed = o.seed * 7919 + static_cast<uint64_t>(i);
    specs.push_back(std::move(s));
  }
  ModeResult r;
  auto t0 = std::chrono::steady_clock::now();
  runner.run(specs, [&](size_t, trainer::Episode& ep) {
    ++r.episodes;
    r.turns += ep.turns;
    r.gen_tokens += ep.model_tokens();
    r.tool_calls += ep.tool_calls;
    r.tool_errors += ep.tool_errors;
    r.env_errors += ep.end == "env_error";
    // The first turn's prompt: the ids before the first model id.
    int64_t first_prompt = 0;
    while (first_prompt < static_cast<int64_t>(ep.mask.size()) && ep.mask[first_prompt] == 0)
      ++first_prompt;
    r.later_prompt += ep.later_prompt_tokens;
    r.later_cached += ep.later_cached_tokens;
    r.later_held += ep.later_held_tokens;
    for (const auto& s : trainer::episode_samples(ep, 0.0)) {
      r.trajectory_tokens += static_cast<int64_t>(s.prompt_ids.size() + s.completion_ids.size());
    }
    // Per-turn packing: each turn a sample of its whole prompt and its reply.
    r.per_turn_tokens += first_prompt + ep.later_prompt_tokens + ep.model_tokens();
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

void add_multi_turn_bench_flags(CLI::App& cmd, MultiTurnBenchOptions& o) {
  cmd.add_option("--model", o.model_dir, "model directory (default: the embedded one)");
  cmd.add_option("--env", o.env, "environment: calculator or a command (as the RL job's --env)")
      ->capture_default_str();
  cmd.add_option("--episodes", o.episodes, "episodes per mode")->capture_default_str();
  cmd.add_option("--env-operands", o.operands, "--env calculator: operands per task (N turns)")
      ->capture_default_str()
      ->check(CLI::Range(2, 8));
  cmd.add_option("--concurrency", o.concurrency,
                 "episodes in flight at most (environment instances; 0: all at once): async starts "
                 "one as one ends, the baseline plays waves of this many")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--max-turns", o.max_turns, "assistant turns per episode at most")
      ->capture_default_str();
  cmd.add_option("--max-tokens", o.max_tokens, "tokens per assistant turn at most")
      ->capture_default_str();
  cmd.add_option("--max-episode-tokens", o.max_episode_tokens, "ids per episode at most")
      ->capture_default_str();
  cmd.add_option("--latency", o.latency, "injected environment latency per step, MIN-MAX ms")
      ->capture_default_str();
  cmd.add_option("--latency-dist", o.latency_dist,
                 "uniform in MIN-MAX, or log-uniform (most calls quick, a long tail)")
      ->capture_default_str()
      ->check(CLI::IsMember({"uniform", "log-uniform"}));
  cmd.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  cmd.add_option("--seed", o.seed, "seed of the tasks, sampling and latencies")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "engine threads")->capture_default_str();
  cmd.add_option("--kv-memory", o.kv_memory, "KV cache pool")->capture_default_str();
  cmd.add_flag("--sync-first", o.sync_first, "run the turn-synchronous mode first");
}

int run_multi_turn_bench(const MultiTurnBenchOptions& o) {
  trainer::EnvOptions eo;
  eo.seed = o.seed;
  eo.calculator_operands = o.operands;
  if (std::sscanf(o.latency.c_str(), "%d-%d", &eo.latency_min_ms, &eo.latency_max_ms) != 2) {
    throw std::invalid_argument("--latency must be MIN-MAX in ms, e.g. 50-500; got '" + o.latency +
                                "'");
  }
  eo.latency_log_uniform = o.latency_dist == "log-uniform";
  engine::EngineConfig ec;
  ec.model_dir = o.model_dir.empty() ? engine::ensure_preset_model("default") : o.model_dir;
  ec.num_threads = o.threads;
  ec.kv_memory_bytes = parse_bytes(o.kv_memory);
  ec.max_seqs = std::max<int32_t>(256, o.episodes);
  ec.seed = o.seed;
  auto eng = std::make_unique<engine::LlmEngine>(ec);
  const text::ChatTemplate chat = text::ChatTemplate::from_model_dir(ec.model_dir);
  std::vector<int32_t> prefix = chat.is_jinja() ? std::vector<int32_t>{} : eng->prompt_prefix();
  const text::Tokenizer* tok = eng->tokenizer();
  if (!tok) throw std::invalid_argument("bench multi-turn needs a model with a tokenizer");
  auto loop = std::make_shared<engine::EngineLoop>(std::move(eng));
  loop->start();
  loop->wait_ready();
  auto env = trainer::make_environment(o.env, eo);
  const text::ToolCallFormat format = text::detect_tool_call_format(chat);
  trainer::MultiTurnOptions mo;
  mo.max_turns = o.max_turns;
  mo.max_tokens_per_turn = o.max_tokens;
  mo.max_episode_tokens = o.max_episode_tokens;
  mo.max_in_flight = o.concurrency;
  trainer::MultiTurnOptions so = mo;
  so.turn_synchronous = true;
  trainer::EpisodeRunner async_runner(*loop, *env, chat, *tok, prefix, format, mo);
  trainer::EpisodeRunner sync_runner(*loop, *env, chat, *tok, prefix, format, so);
  fmt::print(
      "bench multi-turn: {} episodes of {} (tool calls: {}), up to {} turns x {} tokens, "
      "{} in flight, model {}, {} engine threads\n",
      o.episodes, env->name(), text::tool_call_format_name(format), o.max_turns, o.max_tokens,
      o.concurrency > 0 ? std::to_string(o.concurrency) : std::string("all"), ec.model_dir,
      o.threads);
  {  // warm-up (threads, allocator, caches), not reported
    MultiTurnBenchOptions w = o;
    w.episodes = std::min<int32_t>(8, o.episodes);
    w.seed = o.seed + 1000;
    run_mode(async_runner, w, false);
  }
  // Both modes play the same episodes, each from an empty prefix cache (else the second would
  // find the first one's blocks).
  auto fresh = [&] { loop->post([](engine::LlmEngine& e) { e.reset_prefix_cache(); }).get(); };
  ModeResult a, s;
  if (o.sync_first) {
    fresh();
    s = run_mode(sync_runner, o, true);
    fresh();
    a = run_mode(async_runner, o, false);
  } else {
    fresh();
    a = run_mode(async_runner, o, false);
    fresh();
    s = run_mode(sync_runner, o, true);
  }
  loop->stop();
  fmt::print(
      "| mode | seconds | episodes/s | gen tok/s | turns/episode | tool calls | tool errors | "
      "env errors | later-turn prompt cached | of it seen before |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  auto pct = [](int64_t num, int64_t den) { return den > 0 ? 100.0 * num / den : 0.0; };
  for (const auto& [name, r] :
       {std::pair<const char*, const ModeResult&>{"async", a}, {"turn-synchronous", s}}) {
    fmt::print("| {} | {:.2f} | {:.2f} | {:.0f} | {:.2f} | {} | {} | {} | {:.1f}% | {:.1f}% |\n",
               name, r.seconds, r.episodes / r.seconds, r.gen_tokens / r.seconds,
               static_cast<double>(r.turns) / std::max<int64_t>(1, r.episodes), r.tool_calls,
               r.tool_errors, r.env_errors, pct(r.later_cached, r.later_prompt),
               pct(r.later_cached, r.later_held));
  }
  fmt::print(
      "later turns (async): {} prompt ids, {} of them the earlier turns' (seen before), {} served "
      "by the prefix cache\n",
      a.later_prompt, a.later_held, a.later_cached);
  fmt::print("async / turn-synchronous throughput: {:.2f}x (episodes/s)\n",
             (a.episodes / a.seconds) / std::max(1e-9, s.episodes / s.seconds));
  fmt::print(
      "trainer tokens: {} as one sample per trajectory, {} packed per turn ({:.2f}x fewer)\n",
      a.trajectory_tokens, a.per_turn_tokens,
      a.trajectory_tokens > 0 ? static_cast<double>(a.per_turn_tokens) / a.trajectory_tokens : 0.0);
  return 0;
}

}  // namespace crl::bench

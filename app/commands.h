// Subcommands of the colocated-rl executable. Each register_* adds its subcommand and flags to
// the CLI11 app and returns the function that runs it after parsing.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/engine_config.h"

namespace crl::engine {
class LlmEngine;
}

namespace CLI {
class App;
}

namespace crl::app {

using Runner = std::function<int()>;

Runner register_make_model(CLI::App& app);
Runner register_merge_lora(CLI::App& app);
Runner register_generate(CLI::App& app);
Runner register_serve(CLI::App& app);
Runner register_bench(CLI::App& app);
Runner register_sync_check(CLI::App& app);
Runner register_train(CLI::App& app);
Runner register_plan(CLI::App& app);
Runner register_tokenize(CLI::App& app);
Runner register_detokenize(CLI::App& app);

// Engine flags shared by generate, serve and bench (--model, --dtype, --kv-memory, ...).
struct EngineFlags {
  engine::EngineConfig config;
  std::string kv_memory = "256MiB";
  std::vector<std::string> loras;  // --lora NAME=DIR
  // Resolves --model (the embedded default when empty) and --kv-memory into `config`.
  engine::EngineConfig resolve();
};
void add_engine_flags(CLI::App& cmd, EngineFlags& flags);
// " on each of N tensor-parallel ranks ..." after a split engine's KV pool size, with the weight
// bytes a rank holds; "" for one rank.
std::string tensor_parallel_note(const engine::LlmEngine& engine);

}  // namespace crl::app

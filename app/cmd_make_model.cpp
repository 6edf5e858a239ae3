#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"

namespace crl::app {

Runner register_make_model(CLI::App& app) {
  struct Flags {
    std::string out, shape = "default", dtype = "float32", tokenizer_from;
    int64_t vocab = 0, hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, max_pos = 0;
    uint64_t seed = 1234;
    int tie = -1, bias = -1;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "write a model with random weights in the Hugging Face layout (config.json, "
      "model.safetensors, tokenizer); with no --out, (re)creates the embedded default");
  cmd->add_option("--out", f->out, "output directory (default: the cache's default model)");
  std::string shapes;
  for (const std::string& n : engine::preset_names()) shapes += (shapes.empty() ? "" : ", ") + n;
  cmd->add_option("--shape", f->shape, "model shape: " + shapes)->capture_default_str();
  cmd->add_option("--dtype", f->dtype, "stored dtype: float32, bfloat16 or float16")
      ->capture_default_str();
  cmd->add_option("--vocab", f->vocab, "override vocab_size");
  cmd->add_option("--hidden", f->hidden, "override hidden_size");
  cmd->add_option("--ffn", f->ffn, "override intermediate_size");
  cmd->add_option("--layers", f->layers, "override num_hidden_layers");
  cmd->add_option("--heads", f->heads, "override num_attention_heads");
  cmd->add_option("--kv-heads", f->kv_heads, "override num_key_value_heads");
  cmd->add_option("--max-pos", f->max_pos, "override max_position_embeddings");
  cmd->add_option("--tie", f->tie, "tie_word_embeddings (0/1)");
  cmd->add_option("--qkv-bias", f->bias, "q/k/v projection bias (0/1)");
  cmd->add_option("--seed", f->seed, "weight seed")->capture_default_str();
  cmd->add_option("--tokenizer-from", f->tokenizer_from,
                  "a Hugging Face model or tokenizer directory whose tokenizer (tokenizer.json or "
                  ".model, tokenizer_config.json, chat template) the model uses; vocab_size and "
                  "bos/eos ids follow it");
  return [f]() {
    engine::ModelConfig c = engine::preset_config(f->shape);
    if (f->vocab) c.vocab_size = f->vocab;
    if (f->hidden) c.hidden_size = f->hidden;
    if (f->ffn) c.intermediate_size = f->ffn;
    if (f->layers) c.num_layers = f->layers;
    if (f->heads) c.num_heads = f->heads;
    if (f->kv_heads) c.num_kv_heads = f->kv_heads;
    if (f->max_pos) c.max_position_embeddings = f->max_pos;
    if (f->tie >= 0) c.tie_word_embeddings = f->tie != 0;
    if (f->bias >= 0) c.attention_bias = f->bias != 0;
    if (f->hidden || f->heads) c.head_dim = c.hidden_size / c.num_heads;
    c.validate();
    std::string out = f->out;
    if (out.empty()) {
      if (f->shape != "default" || f->vocab || f->hidden || f->ffn || f->layers || f->heads ||
          f->kv_heads || f->max_pos || f->tie >= 0 || f->bias >= 0 || f->dtype != "float32" ||
          !f->tokenizer_from.empty()) {
        throw std::invalid_argument("make-model: pass --out DIR for a non-default shape or dtype");
      }
      out = engine::preset_model_dir("default");
    }
    engine::make_model(out, c, f->seed, f->dtype, f->tokenizer_from);
    if (!f->tokenizer_from.empty()) c = engine::load_model_config(out);
    spdlog::info("wrote {} ({} parameters, {} layers, hidden {}, vocab {}) to {}", f->shape,
                 c.num_params(), c.num_layers, c.hidden_size, c.vocab_size, out);
    return 0;
  };
}

}  // namespace crl::app

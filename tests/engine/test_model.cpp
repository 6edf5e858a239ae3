#include "tests/engine/test_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"

namespace crl::test {

namespace fs = std::filesystem;

std::string test_model_dir(const std::string& variant) {
  const std::string dir = engine::cache_dir() + "/test-models/" + variant;
  if (fs::exists(dir + "/config.json")) return dir;
  engine::ModelConfig c = engine::preset_config("default");
  c.num_layers = 3;
  c.max_position_embeddings = 512;
  if (variant == "qwen2") {
    c.model_type = "qwen2";
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    c.rope_theta = 1e6;
  } else if (variant == "llama3") {
    c.tie_word_embeddings = false;
    c.num_heads = 6;
    c.hidden_size = 192;
    c.head_dim = 32;
    c.rope_scaling = engine::RopeScaling::kLlama3;
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position = 64;
  } else if (variant == "qwen3") {
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.head_dim = 48;  // not hidden_size / num_heads, as in the real Qwen3 models
  } else if (variant == "qwen3-hd64") {
    c.model_type = "qwen3";  // Qwen3-0.6B's attention geometry in small: head_dim 64, GQA group 2
    c.qk_norm = true;
    c.head_dim = 64;
  } else if (variant == "tp4") {
    c.model_type = "qwen2";  // four KV heads (no GQA) and qkv bias: a tensor-parallel group of 4
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    c.num_kv_heads = 4;
  } else if (variant == "tp4-vocab514") {
    c.model_type = "qwen2";  // tp4 with a vocabulary 4 does not divide (2 does)
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    c.num_kv_heads = 4;
    c.vocab_size = 514;
  } else if (variant != "llama") {
    throw std::invalid_argument("unknown test model variant " + variant);
  }
  auto weights = engine::random_init_weights(c, /*seed=*/42, at::kFloat);
  // Its own generator: the model is a function of the variant alone, whichever test process
  // creates it first (the global generator's state depends on what that process ran before).
  at::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/4242);
  for (auto& [name, t] : weights) {
    if (t.dim() == 2) t.mul_(4.0);                                          // sharper logits
    if (name.find(".bias") != std::string::npos) t.normal_(0.0, 0.5, gen);  // non-zero biases
    if (name.find("_norm.weight") != std::string::npos) t.uniform_(0.5, 1.5, gen);  // not all ones
  }
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  engine::write_model_dir(tmp, c, weights, engine::ensure_default_tokenizer());
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp);
  return dir;
}

engine::EngineConfig test_engine_config(const std::string& variant) {
  engine::EngineConfig c;
  c.model_dir = test_model_dir(variant);
  c.dtype = "float32";
  c.block_size = 4;
  c.num_kv_blocks = 256;
  c.max_batched_tokens = 64;
  c.max_seqs = 16;
  c.num_threads = 1;
  c.seed = 5;
  return c;
}

std::string test_model_with_tokenizer_config(const std::string& dir,
                                             const std::string& tokenizer_config,
                                             const std::string& variant) {
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(test_model_dir(variant))) {
    if (entry.path().filename() == "tokenizer_config.json") continue;
    fs::create_symlink(fs::absolute(entry.path()), fs::path(dir) / entry.path().filename());
  }
  std::ofstream(dir + "/tokenizer_config.json") << tokenizer_config;
  return dir;
}

}  // namespace crl::test

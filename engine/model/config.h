// ModelConfig: the Llama-family architecture description read from a Hugging Face config.json.
#pragma once

#include <ATen/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crl::engine {

enum class RopeScaling { kNone, kLinear, kLlama3 };

struct ModelConfig {
  // "llama", "qwen2", "qwen3" or "mistral" (config.json model_type).
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int64_t head_dim = 0;      // defaults to hidden_size / num_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;                   // linear and llama3
  double rope_low_freq_factor = 1.0;          // llama3
  double rope_high_freq_factor = 4.0;         // llama3
  int64_t rope_original_max_position = 8192;  // llama3 original_max_position_embeddings
  bool attention_bias = false;                // q/k/v projections carry a bias (Qwen2: true)
  bool qk_norm = false;                       // RMSNorm of each head's q and k before RoPE (Qwen3)
  bool tie_word_embeddings = false;           // lm_head shares embed_tokens.weight
  std::vector<int64_t> eos_token_ids;         // from config.json / generation_config.json
  int64_t bos_token_id = -1;                  // -1: none
  std::string torch_dtype = "float32";        // stored dtype as declared by config.json
  // Default sampling values from generation_config.json (a request's own values win); unset: < 0.
  double default_temperature = -1, default_top_p = -1;
  int64_t default_top_k = -1;

  // Throws std::invalid_argument naming the field and value when the config is unusable.
  void validate() const;

  // Number of parameters (embedding and, when untied, lm_head included).
  int64_t num_params() const;
};

// One weight the model expects, with its Hugging Face name and shape.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Parses config.json text; `source` (a path) is used in error messages. Throws
// std::invalid_argument.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// Reads <dir>/config.json and, if present, <dir>/generation_config.json (bos/eos override).
ModelConfig load_model_config(const std::string& dir);

// config.json text for `config` (what make-model and checkpoints write).
std::string model_config_to_json(const ModelConfig& config);

// The ordered list of weights of a Llama-family model with this config, in Hugging Face naming:
// model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q/k/v bias), post_attention_layernorm,
// self_attn.{q,k}_norm.weight (Qwen3), mlp.{gate,up,down}_proj.weight, model.norm.weight,
// lm_head.weight (absent when tied).
std::vector<ParamSpec> model_param_specs(const ModelConfig& config);

// "float32" / "bfloat16" / "float16" (also "fp32", "bf16", "fp16") to a scalar type; throws
// otherwise.
at::ScalarType parse_dtype(const std::string& name);
std::string dtype_name(at::ScalarType dtype);

}  // namespace crl::engine

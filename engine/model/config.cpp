#include "engine/model/config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "common/check.h"

namespace crl::engine {
namespace {

using nlohmann::json;

// Reads <path> into a string; throws std::runtime_error naming the file when it cannot be read.
std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path + "' for reading");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw std::runtime_error("error while reading '" + path + "'");
  return os.str();
}

// Field readers for one parsed JSON object; every error names `where_` and the field.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    CRL_INVALID(where_, ": field '", field, "' ", what);
  }

  // True when the field exists and is not null.
  bool has(const std::string& field) const {
    auto it = obj_.find(field);
    return it != obj_.end() && !it->is_null();
  }

  const json& at(const std::string& field) const { return obj_.at(field); }

  int64_t get_int(const std::string& field) const {
    if (!has(field)) CRL_INVALID(where_, ": missing required field '", field, "'");
    return to_int(field, at(field));
  }
  int64_t get_int(const std::string& field, int64_t fallback) const {
    return has(field) ? to_int(field, at(field)) : fallback;
  }
  int64_t to_int(const std::string& field, const json& v) const {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(field, "is too large (got " + v.dump() + ")");
      }
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    fail(field, "must be an integer (got " + v.dump() + ")");
  }

  double get_double(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    return to_double(field, at(field));
  }
  double to_double(const std::string& field, const json& v) const {
    if (!v.is_number()) fail(field, "must be a number (got " + v.dump() + ")");
    return v.get<double>();
  }

  bool get_bool(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!at(field).is_boolean())
      fail(field, "must be true or false (got " + at(field).dump() + ")");
    return at(field).get<bool>();
  }

  std::string get_string(const std::string& field) const {
    if (!has(field)) CRL_INVALID(where_, ": missing required field '", field, "'");
    if (!at(field).is_string()) fail(field, "must be a string (got " + at(field).dump() + ")");
    return at(field).get<std::string>();
  }

  // eos_token_id: an integer or a list of integers (absent/null: empty).
  std::vector<int64_t> get_id_list(const std::string& field) const {
    std::vector<int64_t> ids;
    if (!has(field)) return ids;
    const json& v = at(field);
    if (v.is_array()) {
      for (const auto& e : v) ids.push_back(to_int(field, e));
    } else if (v.is_number()) {
      ids.push_back(to_int(field, v));
    } else {
      fail(field, "must be an integer or a list of integers (got " + v.dump() + ")");
    }
    return ids;
  }

  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
};

json parse_json_object(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    CRL_INVALID(where, ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) CRL_INVALID(where, ": expected a JSON object at top level");
  return j;
}

// A scaling object (rope_scaling's, or transformers 5's rope_parameters) into `c`; `field` names
// it in errors. False when it names no scaling (rope_type "default").
bool parse_rope_kind(const FieldReader& r, const char* field, ModelConfig& c) {
  const json& rs = r.at(field);
  if (!rs.is_object()) r.fail(field, "must be null or an object (got " + rs.dump() + ")");
  FieldReader sub(rs, r.where() + ": " + field);
  std::string kind;
  if (sub.has("rope_type"))
    kind = sub.get_string("rope_type");
  else if (sub.has("type"))
    kind = sub.get_string("type");
  else
    r.fail(field, "has neither 'rope_type' nor 'type'");

  if (kind == "default") return false;
  if (kind == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
    if (!sub.has("factor")) CRL_INVALID(sub.where(), ": missing required field 'factor'");
    c.rope_factor = sub.get_double("factor", 0);
  } else if (kind == "llama3") {
    c.rope_scaling = RopeScaling::kLlama3;
    for (const char* f :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!sub.has(f)) CRL_INVALID(sub.where(), ": missing required field '", f, "'");
    }
    c.rope_factor = sub.get_double("factor", 0);
    c.rope_low_freq_factor = sub.get_double("low_freq_factor", 0);
    c.rope_high_freq_factor = sub.get_double("high_freq_factor", 0);
    c.rope_original_max_position = sub.get_int("original_max_position_embeddings");
  } else {
    r.fail(field, "has unsupported type '" + kind + "' (supported: default, linear, llama3)");
  }
  return true;
}

// RoPE: rope_theta and rope_scaling (transformers 4's config.json), or rope_parameters
// {rope_type, rope_theta, the scaling's fields} (what transformers 5 writes in their place).
// Where both forms are present they must agree.
void parse_rope(const FieldReader& r, ModelConfig& c) {
  c.rope_theta = r.get_double("rope_theta", c.rope_theta);
  const bool scaled = r.has("rope_scaling") && parse_rope_kind(r, "rope_scaling", c);
  if (!r.has("rope_parameters")) return;
  const json& rp = r.at("rope_parameters");
  if (!rp.is_object())
    r.fail("rope_parameters", "must be null or an object (got " + rp.dump() + ")");
  FieldReader sub(rp, r.where() + ": rope_parameters");
  if (!sub.has("rope_theta") && !sub.has("rope_type") && !sub.has("type")) {
    // transformers 5's per-layer-type form ({"full_attention": {...}, ...}) among others.
    r.fail("rope_parameters",
           "has neither 'rope_theta' nor 'rope_type' (per-layer-type RoPE is "
           "not supported)");
  }
  if (sub.has("rope_theta")) {
    const double theta = sub.get_double("rope_theta", c.rope_theta);
    if (r.has("rope_theta") && theta != c.rope_theta) {
      r.fail("rope_parameters", "has rope_theta " + std::to_string(theta) +
                                    " where the top-level rope_theta is " +
                                    std::to_string(c.rope_theta));
    }
    c.rope_theta = theta;
  }
  if (!sub.has("rope_type") && !sub.has("type")) return;
  ModelConfig p = c;
  const bool p_scaled = parse_rope_kind(r, "rope_parameters", p);
  if (r.has("rope_scaling") &&
      (scaled != p_scaled || (p.rope_scaling != c.rope_scaling || p.rope_factor != c.rope_factor ||
                              p.rope_low_freq_factor != c.rope_low_freq_factor ||
                              p.rope_high_freq_factor != c.rope_high_freq_factor ||
                              p.rope_original_max_position != c.rope_original_max_position))) {
    r.fail("rope_parameters", "names another scaling than rope_scaling");
  }
  if (p_scaled) c = p;
}

void check_positive(const std::string& where, const char* field, int64_t v) {
  if (v <= 0) CRL_INVALID(where, ": field '", field, "' must be a positive integer (got ", v, ")");
}

void check_positive(const std::string& where, const char* field, double v) {
  if (!(v > 0)) CRL_INVALID(where, ": field '", field, "' must be a positive number (got ", v, ")");
}

// The checks behind ModelConfig::validate(), with `where` prefixed to every message.
void check_config(const ModelConfig& c, const std::string& where) {
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      c.model_type != "mistral") {
    CRL_INVALID(where, ": field 'model_type' must be one of llama, qwen2, qwen3, mistral (got '",
                c.model_type,
                "'): other architectures (mixture-of-experts models among them) "
                "are not supported");
  }
  check_positive(where, "vocab_size", c.vocab_size);
  check_positive(where, "hidden_size", c.hidden_size);
  check_positive(where, "intermediate_size", c.intermediate_size);
  check_positive(where, "num_hidden_layers", c.num_layers);
  check_positive(where, "num_attention_heads", c.num_heads);
  check_positive(where, "num_key_value_heads", c.num_kv_heads);
  check_positive(where, "head_dim", c.head_dim);
  check_positive(where, "max_position_embeddings", c.max_position_embeddings);
  check_positive(where, "rms_norm_eps", c.rms_norm_eps);
  check_positive(where, "rope_theta", c.rope_theta);
  if (c.num_heads % c.num_kv_heads != 0) {
    CRL_INVALID(where, ": field 'num_attention_heads' (", c.num_heads,
                ") must be divisible by num_key_value_heads (", c.num_kv_heads, ")");
  }
  if (c.rope_scaling != RopeScaling::kNone)
    check_positive(where, "rope_scaling.factor", c.rope_factor);
  if (c.rope_scaling == RopeScaling::kLlama3) {
    check_positive(where, "rope_scaling.low_freq_factor", c.rope_low_freq_factor);
    check_positive(where, "rope_scaling.high_freq_factor", c.rope_high_freq_factor);
    check_positive(where, "rope_scaling.original_max_position_embeddings",
                   c.rope_original_max_position);
    if (!(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
      CRL_INVALID(where, ": field 'rope_scaling.high_freq_factor' (", c.rope_high_freq_factor,
                  ") must be greater than low_freq_factor (", c.rope_low_freq_factor, ")");
    }
  }
  if (c.model_type == "qwen2" && !c.attention_bias) {
    CRL_INVALID(where, ": field 'attention_bias' must be true for model_type 'qwen2'");
  }
  if (c.bos_token_id < -1 || c.bos_token_id >= c.vocab_size) {
    CRL_INVALID(where, ": field 'bos_token_id' must be null or in [0, vocab_size=", c.vocab_size,
                ") (got ", c.bos_token_id, ")");
  }
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      CRL_INVALID(where, ": field 'eos_token_id' must be in [0, vocab_size=", c.vocab_size,
                  ") (got ", id, ")");
    }
  }
  try {
    parse_dtype(c.torch_dtype);
  } catch (const std::invalid_argument&) {
    CRL_INVALID(where, ": field 'torch_dtype' must be float32, bfloat16 or float16 (got '",
                c.torch_dtype, "')");
  }
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Settings that change the model's function in ways this engine does not implement: refused,
// naming the field, rather than silently computing something else.
void check_supported_settings(const FieldReader& r, const ModelConfig& c) {
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (r.has(moe) && r.at(moe).is_number() && r.at(moe).get<double>() > 0) {
      r.fail(moe, "is " + r.at(moe).dump() + ": mixture-of-experts models are not supported");
    }
  }
  // Qwen2/Qwen3 configs carry sliding_window but apply it only with use_sliding_window; Mistral
  // applies sliding_window whenever it is set. Either way it matters only where a sequence can
  // be longer than the window.
  const bool window_on =
      c.model_type == "mistral" ? r.has("sliding_window") : r.get_bool("use_sliding_window", false);
  if (window_on && r.has("sliding_window")) {
    const int64_t w = r.get_int("sliding_window");
    if (w < c.max_position_embeddings) {
      r.fail("sliding_window", "is " + std::to_string(w) +
                                   ", shorter than max_position_embeddings (" +
                                   std::to_string(c.max_position_embeddings) +
                                   "): sliding-window attention is not supported");
    }
  }
  if (r.has("hidden_act") && r.at("hidden_act") != "silu") {
    r.fail("hidden_act", "is " + r.at("hidden_act").dump() + ": only silu is supported");
  }
}

}  // namespace

void ModelConfig::validate() const { check_config(*this, "model config"); }

int64_t ModelConfig::num_params() const {
  int64_t total = 0;
  for (const auto& spec : model_param_specs(*this)) total += numel(spec.shape);
  return total;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const std::string where = "config.json at " + source;
  const json j = parse_json_object(json_text, where);
  FieldReader r(j, where);

  ModelConfig c;
  c.model_type = r.get_string("model_type");
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.num_layers = r.get_int("num_hidden_layers");
  c.num_heads = r.get_int("num_attention_heads");
  check_positive(where, "hidden_size", c.hidden_size);
  check_positive(where, "num_attention_heads", c.num_heads);
  c.num_kv_heads = r.get_int("num_key_value_heads", c.num_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.get_int("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      r.fail("hidden_size", "(" + std::to_string(c.hidden_size) +
                                ") must be divisible by num_attention_heads (" +
                                std::to_string(c.num_heads) + ") when head_dim is absent");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.max_position_embeddings = r.get_int("max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = r.get_double("rms_norm_eps", c.rms_norm_eps);
  parse_rope(r, c);
  c.attention_bias = c.model_type == "qwen2" ? true : r.get_bool("attention_bias", false);
  c.qk_norm = c.model_type == "qwen3";
  check_supported_settings(r, c);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.bos_token_id = r.get_int("bos_token_id", -1);
  c.eos_token_ids = r.get_id_list("eos_token_id");
  // Newer transformers write "dtype" instead of "torch_dtype".
  const char* dtype_field = r.has("torch_dtype") ? "torch_dtype" : "dtype";
  if (r.has(dtype_field)) {
    const std::string dt = r.get_string(dtype_field);
    try {
      c.torch_dtype = dtype_name(parse_dtype(dt));
    } catch (const std::invalid_argument&) {
      r.fail(dtype_field, "must be float32, bfloat16 or float16 (got '" + dt + "')");
    }
  }
  check_config(c, where);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(config_path)) {
    throw std::runtime_error("no config.json in model directory '" + dir + "' (looked for " +
                             config_path + ")");
  }
  ModelConfig c = parse_model_config(read_text_file(config_path), config_path);

  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::is_regular_file(gen_path)) {
    const std::string where = "generation_config.json at " + gen_path;
    const json g = parse_json_object(read_text_file(gen_path), where);
    FieldReader r(g, where);
    if (r.has("bos_token_id")) c.bos_token_id = r.get_int("bos_token_id");
    if (r.has("eos_token_id")) c.eos_token_ids = r.get_id_list("eos_token_id");
    // Default sampling values, applied where a request gives none (as vLLM does by default).
    if (r.get_bool("do_sample", true)) {
      if (r.has("temperature")) c.default_temperature = r.get_double("temperature", -1);
      if (r.has("top_p")) c.default_top_p = r.get_double("top_p", -1);
      if (r.has("top_k")) c.default_top_k = r.get_int("top_k");
    } else {
      c.default_temperature = 0;  // do_sample false: greedy
    }
    check_config(c, config_path + " with " + where);
  }
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  json j;
  const char* arch = c.model_type == "qwen2"     ? "Qwen2ForCausalLM"
                     : c.model_type == "qwen3"   ? "Qwen3ForCausalLM"
                     : c.model_type == "mistral" ? "MistralForCausalLM"
                                                 : "LlamaForCausalLM";
  j["architectures"] = json::array({arch});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling) {
    case RopeScaling::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"type", "linear"}, {"factor", c.rope_factor}};
      break;
    case RopeScaling::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_factor},
                           {"low_freq_factor", c.rope_low_freq_factor},
                           {"high_freq_factor", c.rope_high_freq_factor},
                           {"original_max_position_embeddings", c.rope_original_max_position}};
      break;
  }
  j["attention_bias"] = c.attention_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else
    j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = c.torch_dtype;
  j["hidden_act"] = "silu";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

std::vector<ParamSpec> model_param_specs(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "self_attn.q_proj.weight", {q_dim, h}});
    if (c.attention_bias) specs.push_back({p + "self_attn.q_proj.bias", {q_dim}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_dim, h}});
    if (c.attention_bias) specs.push_back({p + "self_attn.k_proj.bias", {kv_dim}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_dim, h}});
    if (c.attention_bias) specs.push_back({p + "self_attn.v_proj.bias", {kv_dim}});
    specs.push_back({p + "self_attn.o_proj.weight", {h, q_dim}});
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "float") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return at::kHalf;
  CRL_INVALID("unknown dtype '", name, "' (expected float32, bfloat16 or float16)");
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      CRL_INVALID("dtype_name: unsupported scalar type ", static_cast<int>(dtype));
  }
}

}  // namespace crl::engine

#include "engine/model/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tests/test_utils.h"

namespace crl::engine {
namespace {

using nlohmann::json;

// A small valid Llama config.json.
json base_json() {
  return json{{"model_type", "llama"},
              {"vocab_size", 300},
              {"hidden_size", 64},
              {"intermediate_size", 128},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"bos_token_id", 2},
              {"eos_token_id", 3},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"}};
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "/x/config.json"); }

void expect_config_eq(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling, b.rope_scaling);
  EXPECT_EQ(a.rope_factor, b.rope_factor);
  EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor);
  EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor);
  EXPECT_EQ(a.rope_original_max_position, b.rope_original_max_position);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
}

TEST(ModelConfigTest, ParsesHuggingFaceLlama31Config) {
  const char* text = R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})";
  const ModelConfig c = parse_model_config(text, "/m/config.json");
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_original_max_position, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.attention_bias);
  // Llama-3.1-8B: 8.03 B parameters.
  EXPECT_EQ(c.num_params(), 8030261248);
}

// transformers 5 writes rope_parameters {rope_type, rope_theta, the scaling's fields} in place of
// rope_theta and rope_scaling: read as the same RoPE (a checkpoint saved by it once loaded with
// theta 10000 and no scaling, silently); where both forms are present they must agree.
TEST(ModelConfigTest, ReadsTransformers5RopeParameters) {
  json j = base_json();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);

  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_factor, 8.0);
  EXPECT_EQ(c.rope_original_max_position, 8192);
  // The legacy fields beside it, agreeing (transformers 4 reading a 5 config keeps both).
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = j["rope_parameters"];
  j["rope_scaling"].erase("rope_theta");
  expect_config_eq(parse(j), c);

  json bad = j;
  bad["rope_theta"] = 10000.0;
  ASSERT_THROWS_WITH(parse(bad), std::invalid_argument,
                     "field 'rope_parameters' has rope_theta 500000.000000 where the top-level "
                     "rope_theta is 10000.000000");
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  ASSERT_THROWS_WITH(parse(bad), std::invalid_argument,
                     "field 'rope_parameters' names another scaling than rope_scaling");
  bad = j;
  bad.erase("rope_scaling");
  bad["rope_parameters"]["rope_type"] = "yarn";
  ASSERT_THROWS_WITH(parse(bad), std::invalid_argument,
                     "field 'rope_parameters' has unsupported type 'yarn'");
  bad["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  ASSERT_THROWS_WITH(parse(bad), std::invalid_argument,
                     "field 'rope_parameters' has neither 'rope_theta' nor 'rope_type'");
  bad["rope_parameters"] = 5;
  ASSERT_THROWS_WITH(parse(bad), std::invalid_argument,
                     "field 'rope_parameters' must be null or an object");
}

TEST(ModelConfigTest, DefaultsKvHeadsHeadDimAndTying) {
  json j = base_json();
  j.erase("num_key_value_heads");
  j.erase("tie_word_embeddings");
  j.erase("bos_token_id");
  j["eos_token_id"] = nullptr;
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";  // newer transformers spelling
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  j.erase("dtype");
  EXPECT_EQ(parse(j).torch_dtype, "float32");
}

TEST(ModelConfigTest, RoundTripsEveryFieldThroughJson) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 1000;
  c.hidden_size = 96;
  c.intermediate_size = 200;
  c.num_layers = 3;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 32;  // not hidden / heads
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1.2345678901234e-6;
  c.rope_theta = 123456.789;
  c.rope_scaling = RopeScaling::kLlama3;
  c.rope_factor = 8.5;
  c.rope_low_freq_factor = 1.5;
  c.rope_high_freq_factor = 3.25;
  c.rope_original_max_position = 1024;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {7, 9};
  c.bos_token_id = 5;
  c.torch_dtype = "bfloat16";
  const std::string text = model_config_to_json(c);
  expect_config_eq(parse_model_config(text, "rt"), c);
  EXPECT_EQ(json::parse(text)["architectures"], json::array({"LlamaForCausalLM"}));

  // Fields that only llama3 scaling uses are not written for other kinds: back to defaults.
  c.model_type = "qwen2";
  c.rope_scaling = RopeScaling::kLinear;
  c.rope_factor = 2.0;
  c.rope_low_freq_factor = ModelConfig().rope_low_freq_factor;
  c.rope_high_freq_factor = ModelConfig().rope_high_freq_factor;
  c.rope_original_max_position = ModelConfig().rope_original_max_position;
  c.eos_token_ids = {9};
  c.bos_token_id = -1;
  c.tie_word_embeddings = false;
  const std::string qwen_text = model_config_to_json(c);
  expect_config_eq(parse_model_config(qwen_text, "rt"), c);
  const json qj = json::parse(qwen_text);
  EXPECT_EQ(qj["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_TRUE(qj["bos_token_id"].is_null());
  EXPECT_EQ(qj["eos_token_id"], 9);

  c.model_type = "mistral";
  c.attention_bias = false;
  c.rope_scaling = RopeScaling::kNone;
  c.rope_factor = 1.0;
  const std::string mistral_text = model_config_to_json(c);
  expect_config_eq(parse_model_config(mistral_text, "rt"), c);
  EXPECT_TRUE(json::parse(mistral_text)["rope_scaling"].is_null());
}

TEST(ModelConfigTest, LlamaSpecsListEveryWeightInOrderWithShapes) {
  const ModelConfig c = parse(base_json());  // H 64, heads 4, kv 2, hd 16, I 128, V 300, 2 layers
  const auto specs = model_param_specs(c);
  ASSERT_EQ(specs.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(specs[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{300, 64}));
  const std::vector<std::pair<std::string, std::vector<int64_t>>> layer1 = {
      {"model.layers.1.input_layernorm.weight", {64}},
      {"model.layers.1.self_attn.q_proj.weight", {64, 64}},
      {"model.layers.1.self_attn.k_proj.weight", {32, 64}},
      {"model.layers.1.self_attn.v_proj.weight", {32, 64}},
      {"model.layers.1.self_attn.o_proj.weight", {64, 64}},
      {"model.layers.1.post_attention_layernorm.weight", {64}},
      {"model.layers.1.mlp.gate_proj.weight", {128, 64}},
      {"model.layers.1.mlp.up_proj.weight", {128, 64}},
      {"model.layers.1.mlp.down_proj.weight", {64, 128}}};
  for (size_t i = 0; i < layer1.size(); ++i) {
    EXPECT_EQ(specs[10 + i].name, layer1[i].first);
    EXPECT_EQ(specs[10 + i].shape, layer1[i].second) << layer1[i].first;
  }
  EXPECT_EQ(specs[19].name, "model.norm.weight");
  EXPECT_EQ(specs[20].name, "lm_head.weight");
  EXPECT_EQ(specs[20].shape, (std::vector<int64_t>{300, 64}));
  const int64_t per_layer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 128 * 64;
  EXPECT_EQ(c.num_params(), 2 * 300 * 64 + 2 * per_layer + 64);
}

TEST(ModelConfigTest, TiedEmbeddingsDropLmHead) {
  json j = base_json();
  j["tie_word_embeddings"] = true;
  const ModelConfig c = parse(j);
  const auto specs = model_param_specs(c);
  for (const auto& s : specs) EXPECT_NE(s.name, "lm_head.weight");
  EXPECT_EQ(c.num_params(), parse(base_json()).num_params() - 300 * 64);
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBiasSpecs) {
  json j = base_json();
  j["model_type"] = "qwen2";
  j["attention_bias"] = false;  // ignored: Qwen2 always has q/k/v bias
  const ModelConfig c = parse(j);
  EXPECT_TRUE(c.attention_bias);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& s : model_param_specs(c)) shapes[s.name] = s.shape;
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.v_proj.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(c.num_params(), parse(base_json()).num_params() + 2 * (64 + 32 + 32));

  ModelConfig bad = c;
  bad.attention_bias = false;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "attention_bias");
}

TEST(ModelConfigTest, ParsesEveryRopeScalingKind) {
  json j = base_json();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_factor, 4.0);

  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2}};
  EXPECT_DOUBLE_EQ(parse(j).rope_factor, 2.0);

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(j).rope_scaling, RopeScaling::kNone);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(j).rope_scaling, RopeScaling::kNone);

  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_factor, 32.0);

  j["rope_scaling"].erase("low_freq_factor");
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument, "'low_freq_factor'");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument, "'yarn'");
  j["rope_scaling"] = {{"type", "linear"}};
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument, "'factor'");
  j["rope_scaling"] = "linear";
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument, "field 'rope_scaling'");
}

TEST(ModelConfigTest, RejectsBadConfigsNamingSourceAndField) {
  ASSERT_THROWS_WITH(parse_model_config("{\"model_type\": ", "/x/config.json"),
                     std::invalid_argument, "config.json at /x/config.json: invalid JSON");
  ASSERT_THROWS_WITH(parse_model_config("[1, 2]", "/x/config.json"), std::invalid_argument,
                     "JSON object");

  struct Case {
    const char* field;
    json value;  // null: erase the field
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"hidden_size", -3,
       "config.json at /x/config.json: field 'hidden_size' must be a positive integer (got -3)"},
      {"hidden_size", nullptr, "missing required field 'hidden_size'"},
      {"vocab_size", "300", "field 'vocab_size' must be an integer (got \"300\")"},
      {"num_hidden_layers", 2.5, "field 'num_hidden_layers' must be an integer (got 2.5)"},
      {"num_hidden_layers", 0, "field 'num_hidden_layers' must be a positive integer (got 0)"},
      {"num_key_value_heads", 3,
       "num_attention_heads' (4) must be divisible by num_key_value_heads (3)"},
      {"model_type", "gpt2",
       "field 'model_type' must be one of llama, qwen2, qwen3, mistral (got 'gpt2')"},
      {"model_type", nullptr, "missing required field 'model_type'"},
      {"eos_token_id", "eos", "field 'eos_token_id' must be an integer or a list"},
      {"eos_token_id", 300, "field 'eos_token_id' must be in [0, vocab_size=300)"},
      {"torch_dtype", "int8",
       "field 'torch_dtype' must be float32, bfloat16 or float16 (got 'int8')"},
      {"rms_norm_eps", "small", "field 'rms_norm_eps' must be a number"},
      {"rms_norm_eps", -1.0, "field 'rms_norm_eps' must be a positive number"},
      {"tie_word_embeddings", 1, "field 'tie_word_embeddings' must be true or false"},
      {"num_experts", 64, "field 'num_experts' is 64: mixture-of-experts models are not supported"},
      {"num_local_experts", 8, "mixture-of-experts models are not supported"},
      {"hidden_act", "gelu", "field 'hidden_act' is \"gelu\": only silu is supported"},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.field);
    json j = base_json();
    if (tc.value.is_null())
      j.erase(tc.field);
    else
      j[tc.field] = tc.value;
    ASSERT_THROWS_WITH(parse(j), std::invalid_argument, tc.expected);
  }

  json j = base_json();
  j.erase("num_key_value_heads");
  j["num_attention_heads"] = 5;  // 64 % 5 != 0 and no head_dim given
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument, "divisible by num_attention_heads");
  j["head_dim"] = 16;  // an explicit head_dim lifts that requirement
  EXPECT_EQ(parse(j).head_dim, 16);
}

TEST(ModelConfigTest, ParsesQwen3WithHeadDimFromTheConfigAndPerHeadNorms) {
  // The shape of Qwen/Qwen3-0.6B's config.json.
  json j = {{"architectures", {"Qwen3ForCausalLM"}},
            {"model_type", "qwen3"},
            {"vocab_size", 151936},
            {"hidden_size", 1024},
            {"intermediate_size", 3072},
            {"num_hidden_layers", 28},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 8},
            {"head_dim", 128},
            {"max_position_embeddings", 40960},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000},
            {"rope_scaling", nullptr},
            {"attention_bias", false},
            {"tie_word_embeddings", true},
            {"use_sliding_window", false},
            {"sliding_window", nullptr},
            {"max_window_layers", 28},
            {"hidden_act", "silu"},
            {"bos_token_id", 151643},
            {"eos_token_id", 151645},
            {"torch_dtype", "bfloat16"}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.head_dim, 128);  // not hidden_size / num_attention_heads = 64
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  auto specs = model_param_specs(c);
  int norms = 0;
  for (const auto& s : specs) {
    if (s.name.find("_norm.weight") != std::string::npos) {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{128})) << s.name;
      ++norms;
    }
    if (s.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{16 * 128, 1024}));
    }
  }
  EXPECT_EQ(norms, 2 * 28);
  EXPECT_EQ(c.num_params(), 596049920);  // Qwen3-0.6B's parameter count, tied
  // Round trip through config.json keeps the architecture.
  ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_EQ(back.model_type, "qwen3");
  EXPECT_TRUE(back.qk_norm);
  EXPECT_EQ(back.head_dim, 128);

  // A sliding window that takes effect is refused; one that cannot is not.
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  ASSERT_THROWS_WITH(parse(j), std::invalid_argument,
                     "field 'sliding_window' is 4096, shorter than max_position_embeddings "
                     "(40960): sliding-window attention is not supported");
  j["sliding_window"] = 40960;
  EXPECT_NO_THROW(parse(j));
}

TEST(ModelConfigTest, GenerationConfigGivesDefaultSamplingValues) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << base_json().dump();
  ModelConfig c = load_model_config(dir.path());
  EXPECT_LT(c.default_temperature, 0);  // none
  std::ofstream(dir.file("generation_config.json"))
      << R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [3]})";
  c = load_model_config(dir.path());
  EXPECT_DOUBLE_EQ(c.default_temperature, 0.6);
  EXPECT_DOUBLE_EQ(c.default_top_p, 0.95);
  EXPECT_EQ(c.default_top_k, 20);
  std::ofstream(dir.file("generation_config.json"))
      << R"({"do_sample": false, "temperature": 0.6})";
  EXPECT_EQ(load_model_config(dir.path()).default_temperature, 0);  // greedy
}

TEST(ModelConfigTest, ValidateRejectsNonPositiveAndIndivisibleFields) {
  ModelConfig c = parse(base_json());
  c.validate();
  ModelConfig bad = c;
  bad.num_kv_heads = 0;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "'num_key_value_heads'");
  bad = c;
  bad.num_kv_heads = 3;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "divisible");
  bad = c;
  bad.head_dim = -1;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "'head_dim'");
  bad = c;
  bad.rope_scaling = RopeScaling::kLlama3;
  bad.rope_low_freq_factor = 4.0;
  bad.rope_high_freq_factor = 4.0;
  ASSERT_THROWS_WITH(bad.validate(), std::invalid_argument, "high_freq_factor");
}

TEST(ModelConfigTest, GenerationConfigOverridesBosAndEos) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << base_json().dump();
  ModelConfig c = load_model_config(dir.path());
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{3}));

  std::ofstream(dir.file("generation_config.json"))
      << R"({"bos_token_id": 1, "eos_token_id": [3, 4]})";
  c = load_model_config(dir.path());
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{3, 4}));

  std::ofstream(dir.file("generation_config.json")) << R"({"eos_token_id": 999})";
  ASSERT_THROWS_WITH(load_model_config(dir.path()), std::invalid_argument,
                     "generation_config.json");
  std::ofstream(dir.file("generation_config.json")) << "not json";
  ASSERT_THROWS_WITH(load_model_config(dir.path()), std::invalid_argument, "invalid JSON");

  ASSERT_THROWS_WITH(load_model_config(dir.file("nope")), std::runtime_error, "config.json");
}

TEST(ModelConfigTest, ParsesAndNamesDtypes) {
  EXPECT_EQ(parse_dtype("float32"), at::kFloat);
  EXPECT_EQ(parse_dtype("fp32"), at::kFloat);
  EXPECT_EQ(parse_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_dtype("float16"), at::kHalf);
  EXPECT_EQ(dtype_name(at::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(parse_dtype("fp16")), "float16");
  ASSERT_THROWS_WITH(parse_dtype("int4"), std::invalid_argument, "'int4'");
}

}  // namespace
}  // namespace crl::engine

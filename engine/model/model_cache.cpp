#include "engine/model/model_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/model/model_writer.h"
#include "text/tokenizer.h"

namespace crl::engine {

namespace fs = std::filesystem;

namespace {
// Bump when a preset or the generator changes, so stale caches are not reused.
constexpr const char* kCacheVersion = "v1";

std::string unique_tmp(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

// Renames tmp over dst; if another process won the race, keeps theirs.
void publish_dir(const std::string& tmp, const std::string& dst) {
  std::error_code ec;
  fs::rename(tmp, dst, ec);
  if (ec) {
    fs::remove_all(tmp);
    if (!fs::exists(dst)) throw std::runtime_error("cannot create " + dst + ": " + ec.message());
  }
}
}  // namespace

std::string cache_dir() {
  if (const char* d = std::getenv("CRL_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return std::string(d) + "/colocated-rl";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/colocated-rl";
  return (fs::temp_directory_path() / "colocated-rl").string();
}

std::vector<std::string> preset_names() {
  return {"default", "smollm2-135m", "qwen2-0.5b", "qwen2-1.5b", "qwen3-0.6b"};
}

std::vector<std::string> planning_shape_names() {
  return {"llama3.1-8b", "qwen2.5-7b", "qwen3-8b", "qwen2.5-32b"};
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  c.bos_token_id = 2;
  c.eos_token_ids = {3};
  c.tie_word_embeddings = true;
  if (name == "default") {
    c.vocab_size = 512;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_layers = 4;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
  } else if (name == "smollm2-135m") {
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_layers = 30;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000.0;
    c.rms_norm_eps = 1e-5;
  } else if (name == "qwen2-0.5b" || name == "qwen2-1.5b") {
    const bool small = name == "qwen2-0.5b";
    c.model_type = "qwen2";
    c.attention_bias = true;
    c.vocab_size = 151936;
    c.hidden_size = small ? 896 : 1536;
    c.intermediate_size = small ? 4864 : 8960;
    c.num_layers = small ? 24 : 28;
    c.num_heads = small ? 14 : 12;
    c.num_kv_heads = 2;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
  } else if (name == "qwen3-0.6b") {
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.tie_word_embeddings = true;
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_layers = 28;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;  // not hidden_size / num_heads
    c.max_position_embeddings = 40960;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    return c;
  } else if (name == "llama3.1-8b") {
    c.model_type = "llama";
    c.tie_word_embeddings = false;
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
  } else if (name == "qwen2.5-7b" || name == "qwen2.5-32b") {
    const bool small = name == "qwen2.5-7b";
    c.model_type = "qwen2";
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    c.vocab_size = 152064;
    c.hidden_size = small ? 3584 : 5120;
    c.intermediate_size = small ? 18944 : 27648;
    c.num_layers = small ? 28 : 64;
    c.num_heads = small ? 28 : 40;
    c.num_kv_heads = small ? 4 : 8;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = small ? 1e-6 : 1e-5;
  } else if (name == "qwen3-8b") {
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.tie_word_embeddings = false;
    c.vocab_size = 151936;
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_layers = 36;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    return c;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    for (const auto& n : planning_shape_names()) known += ", " + n;
    throw std::invalid_argument("unknown model shape '" + name + "' (known: " + known + ")");
  }
  c.head_dim = c.hidden_size / c.num_heads;
  return c;
}

std::string ensure_default_tokenizer() {
  const std::string dir = cache_dir() + "/tokenizer";
  const std::string model = dir + "/default-" + kCacheVersion + ".model";
  if (fs::exists(model)) return model;
  fs::create_directories(dir);
  const std::string tmp_dir = unique_tmp(dir + "/train");
  fs::create_directories(tmp_dir);
  {
    std::ofstream corpus(tmp_dir + "/corpus.txt");
    corpus << default_corpus_text();
  }
  text::Tokenizer::train(tmp_dir + "/corpus.txt", tmp_dir + "/tok", 512);
  std::error_code ec;
  fs::rename(tmp_dir + "/tok.model", model, ec);
  fs::remove_all(tmp_dir);
  if (!fs::exists(model)) throw std::runtime_error("cannot create tokenizer " + model);
  return model;
}

void make_model(const std::string& dir, const ModelConfig& config, uint64_t seed,
                const std::string& dtype, const std::string& tokenizer_from) {
  const at::ScalarType stored = parse_dtype(dtype);
  ModelConfig c = config;
  c.torch_dtype = dtype_name(stored);
  std::string tok = tokenizer_from;
  if (tokenizer_from.empty()) {
    tok = ensure_default_tokenizer();
  } else {
    if (!fs::is_directory(tokenizer_from) || !text::Tokenizer::dir_has_tokenizer(tokenizer_from)) {
      throw std::invalid_argument("make-model: --tokenizer-from " + tokenizer_from +
                                  " is not a directory holding tokenizer.json or tokenizer.model");
    }
    const text::Tokenizer t(tokenizer_from);
    c.vocab_size = std::max<int64_t>(c.vocab_size, t.vocab_size());
    c.bos_token_id = t.bos_id();
    // Qwen's tokenizers add no BOS (bos_token null), while the released Qwen2/2.5/3 configs name
    // <|endoftext|> as bos_token_id: write what they write. Nothing adds it to prompts (the
    // engine follows the tokenizer).
    if (c.bos_token_id < 0 && (c.model_type == "qwen2" || c.model_type == "qwen3")) {
      c.bos_token_id = t.piece_to_id("<|endoftext|>");
    }
    if (t.eos_id() < 0) {
      throw std::invalid_argument("make-model: the tokenizer in " + tokenizer_from +
                                  " names no eos_token (tokenizer_config.json or "
                                  "special_tokens_map.json): generation could never stop");
    }
    c.eos_token_ids = {t.eos_id()};
    c.validate();
  }
  const fs::path target = fs::absolute(dir);
  // Never wipe a directory that is not a model: only an empty one or an earlier model is replaced.
  if (fs::exists(target) && !fs::is_empty(target) && !fs::exists(target / "config.json")) {
    throw std::invalid_argument("make-model: " + target.string() +
                                " exists and is not a model directory (no config.json); "
                                "refusing to replace it");
  }
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = unique_tmp(target.string());
  fs::remove_all(tmp);
  write_model_dir(tmp, c, random_init_weights(c, seed, stored), tok);
  fs::remove_all(target);
  publish_dir(tmp, target.string());
}

std::string preset_model_dir(const std::string& name, const std::string& dtype) {
  return cache_dir() + "/models/" + name + "-" + dtype_name(parse_dtype(dtype)) + "-" +
         kCacheVersion;
}

std::string ensure_preset_model(const std::string& name, const std::string& dtype) {
  const auto planning = planning_shape_names();
  if (std::find(planning.begin(), planning.end(), name) != planning.end()) {
    throw std::invalid_argument("model shape '" + name +
                                "' is for planning (colocated-rl plan --shape): its random weights "
                                "are not generated; make-model --shape with smaller dimensions is");
  }
  ModelConfig c = preset_config(name);
  const std::string stored = dtype_name(parse_dtype(dtype));
  const std::string dir = preset_model_dir(name, dtype);
  if (fs::exists(dir + "/config.json")) return dir;
  const std::string tmp = unique_tmp(dir);
  fs::remove_all(tmp);
  c.torch_dtype = stored;
  write_model_dir(tmp, c, random_init_weights(c, /*seed=*/1234, parse_dtype(stored)),
                  ensure_default_tokenizer());
  publish_dir(tmp, dir);
  return dir;
}

}  // namespace crl::engine

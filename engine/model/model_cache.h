// Named model shapes and the on-disk cache of generated models (the embedded default).
//
// Presets: "default" (the small embedded model every command uses without --model),
// "smollm2-135m", "qwen2-0.5b", "qwen2-1.5b" (random weights in those shapes, for benchmarks).
// Generated models live under cache_dir()/models/<name>; they are written to a temp directory and
// renamed into place, so concurrent processes never see a half-written model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"

namespace crl::engine {

// CRL_CACHE_DIR, else $XDG_CACHE_HOME/colocated-rl, else $HOME/.cache/colocated-rl.
std::string cache_dir();

// The architecture of a preset or a planning shape; throws std::invalid_argument listing the
// known names.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();
// Real models' shapes too large to generate here (`colocated-rl plan --shape`, `make-model --shape`
// with smaller dimensions): llama3.1-8b, qwen2.5-7b, qwen3-8b, qwen2.5-32b.
std::vector<std::string> planning_shape_names();

// The default tokenizer (trained once from default_corpus_text into the cache); returns its path.
std::string ensure_default_tokenizer();

// Writes a model with `config`, random weights from `seed` stored as `dtype`, and a tokenizer,
// into `dir` (atomically: temp dir + rename). The tokenizer is the default one, or with
// `tokenizer_from` (a Hugging Face model or tokenizer directory) that one's files: the config's
// bos/eos ids then come from it, and vocab_size too unless config.vocab_size is already larger. An
// existing empty directory or model directory (one with config.json) is replaced; any other
// existing directory is refused (std::invalid_argument), so a mistyped --out never wipes unrelated
// files.
void make_model(const std::string& dir, const ModelConfig& config, uint64_t seed,
                const std::string& dtype, const std::string& tokenizer_from = "");

// Where preset `name` stored as `dtype` lives in the cache.
std::string preset_model_dir(const std::string& name, const std::string& dtype = "float32");

// The directory of preset `name` in the cache, generated on first use. Returns its path.
std::string ensure_preset_model(const std::string& name, const std::string& dtype = "float32");

}  // namespace crl::engine

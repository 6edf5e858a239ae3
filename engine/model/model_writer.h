// Creating model directories from scratch: deterministic random weights, a default tokenizer
// training corpus, and a Hugging Face style directory layout that load_model_config,
// load_checkpoint and Tokenizer read back.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "engine/model/config.h"
#include "engine/model/weight_loader.h"

namespace crl::engine {

// One tensor per model_param_specs(config) entry, in that order, of `dtype` (CPU): normal(0, 0.02)
// for matrices (o_proj and down_proj scaled by 1/sqrt(2 * num_layers)), zeros for biases, ones for
// norms. Drawn from a local generator seeded with `seed`: the same (config, seed) always gives the
// same weights, whatever the global RNG state.
NamedTensors random_init_weights(const ModelConfig& config, uint64_t seed, at::ScalarType dtype);

// A deterministic English + arithmetic text (one sentence per line, ~200 KB) for training the
// default tokenizer: template sentences, counting, "12 + 7 = 19",
// "Question: what is 3 plus 4? Answer: 7". Identical on every call and platform.
std::string default_corpus_text();

// Creates `dir` (and parents) and writes a loadable model directory:
//   config.json (model_config_to_json), generation_config.json (bos/eos),
//   model.safetensors (weights, atomically), and the tokenizer from `tokenizer_source`:
//   - a tokenizer.model file: copied, with a tokenizer_config.json written here (bos/eos/pad/unk
//     tokens as piece strings, add_bos_token, model_max_length);
//   - a directory (a Hugging Face model or tokenizer directory): its tokenizer.json or
//     tokenizer.model, tokenizer_config.json, special_tokens_map.json, chat_template.jinja and
//     generation_config.json are copied as they are (so a real model keeps its chat template and
//     sampling defaults; checkpoints of it too), and only the vocabulary size is checked.
// Throws std::invalid_argument when the config is invalid, the weights do not match
// model_param_specs(config) by name and shape, or the tokenizer disagrees with the config
// (vocabulary larger than vocab_size, different bos/eos); std::runtime_error on I/O failure.
void write_model_dir(const std::string& dir, const ModelConfig& config, const NamedTensors& weights,
                     const std::string& tokenizer_source);

}  // namespace crl::engine

// Small generated models for engine tests, cached under $CRL_CACHE_DIR/test-models.
#pragma once

#include <string>

#include "engine/engine_config.h"

namespace crl::test {

// Variants:
//   "llama"  — tied embeddings, no bias, plain RoPE, 3 layers, GQA 4/2;
//   "qwen2"  — qkv bias, untied lm_head, rope_theta 1e6;
//   "llama3" — untied, llama3 rope scaling, GQA 6/2 heads;
//   "qwen3"  — per-head q/k RMSNorm, head_dim 48 != hidden / heads, tied;
//   "qwen3-hd64" — the same with head_dim 64 (GQA 4/2: a shape FlashInfer's decode kernel takes);
//   "tp4"    — qkv bias, untied, 4 heads and 4 KV heads (splits over a tensor-parallel group of 4).
//   "tp4-vocab514" — tp4 with 514 vocabulary entries (a group of 4 keeps the vocabulary whole).
// Weights are scaled up from the usual init so logits are well separated (greedy ties would make
// token-exact comparisons fragile). Created once; concurrent processes publish atomically.
std::string test_model_dir(const std::string& variant = "llama");

// `dir` made a copy of test_model_dir(variant) (its files linked) whose tokenizer_config.json is
// `tokenizer_config` (a JSON object): a model directory carrying a chat template. Returns `dir`.
std::string test_model_with_tokenizer_config(const std::string& dir,
                                             const std::string& tokenizer_config,
                                             const std::string& variant = "llama");

// An engine config for a test model: float32, 1 thread, block size 4, small pools.
engine::EngineConfig test_engine_config(const std::string& variant = "llama");

}  // namespace crl::test

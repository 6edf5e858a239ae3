// EngineConfig: everything needed to build an LlmEngine.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crl::engine {

// What a weight update does to the sequences in flight (vLLM/AReaL's choices for async RL):
enum class InflightPolicy {
  kKeep,       // continue on the K/V computed with the old weights (no work lost)
  kRecompute,  // recompute the K/V of every running sequence under the new weights
  kAbort,      // restart every unfinished sequence from its prompt
};
// "keep", "recompute", "abort"; the parser throws std::invalid_argument naming the choices.
const char* inflight_policy_name(InflightPolicy policy);
InflightPolicy parse_inflight_policy(const std::string& name);

struct EngineConfig {
  // Hugging Face model directory (config.json, *.safetensors, tokenizer.model).
  std::string model_dir;
  // Compute dtype: "float32" or "bfloat16".
  std::string dtype = "float32";
  // "cpu" or "cuda[:i]".
  std::string device = "cpu";
  // Bytes of the KV block pool (K and V, all layers).
  int64_t kv_memory_bytes = int64_t{256} << 20;
  // Blocks in the KV pool; overrides kv_memory_bytes when > 0.
  int32_t num_kv_blocks = 0;
  // Tokens per KV block.
  int32_t block_size = 16;
  // Token budget of one engine step (prefill chunks + decodes).
  int64_t max_batched_tokens = 1024;
  // Sequences in the running batch at most.
  int32_t max_seqs = 256;
  // Context length (prompt + output); 0 = the model's max_position_embeddings.
  int64_t max_model_len = 0;
  // Reuse KV of full blocks across requests with equal prefixes.
  bool enable_prefix_caching = true;
  // Batch-invariant logits (fixed-shape row tiles); slower, see Transformer.
  bool deterministic = false;
  // CPU kernels outside deterministic mode: "auto" runs the project's (engine/kernels) where
  // `bench linear` measures them faster: float32 linear layers for steps of 2+ tokens (the GEMV
  // kernel for one), bfloat16 ones from 3 tokens on AVX512-BF16 CPUs, RMSNorm and the SiLU gate;
  // "libtorch" runs at::linear (OpenBLAS / oneDNN) and ATen's ops as before.
  std::string cpu_kernels = "auto";
  // Outside deterministic mode, q/k/v and gate/up run as one product each
  // (TransformerOptions::merge_projections; `bench rollout`'s mode "merged"). Off: on the CPU it
  // measured level with five products a layer within the machine's noise
  // (docs/results/2026-11-30-merged-projections-cpu.md); on GPUs, where fewer and larger GEMMs are
  // expected to pay, it has not run yet.
  bool merge_projections = false;
  // GPU kernels: "auto" runs RMSNorm, RoPE, the SiLU gate and the tensor sampler's plain rows as
  // the project's fused CUDA kernels (engine/kernels/cuda_ops.h) on a CUDA device; "libtorch" runs
  // ATen's composition of them.
  std::string gpu_kernels = "auto";
  // Sampler: "auto" samples where the logits are (the tensor sampler on a GPU, so only ids and
  // log-probs come back; the CPU engine's own sampler on the CPU); "tensor" and "cpu" force one
  // ("cpu" on a GPU copies each step's logits to the host: the baseline `bench rollout` compares).
  std::string sampler = "auto";
  // Decode steps replay CUDA graphs captured at batch-size buckets (1, 2, 4, ... up to max_seqs):
  // "auto" on a CUDA device (measured 1.12x faster end to end, README "GPU"), "on" (an error off
  // CUDA), "off".
  std::string cuda_graphs = "auto";
  // LoRA adapters served unmerged (engine/model/lora.h): slots (0 = none), the largest rank a slot
  // holds, and the layers slots may adapt ("all-linear" or a list of q,k,v,o,gate,up,down).
  int32_t max_loras = 0;
  int32_t max_lora_rank = 16;
  std::string lora_targets = "all-linear";
  // PEFT adapter directories the engine loads at start, by name (serve --lora NAME=DIR); at least
  // this many slots are made whatever max_loras says.
  std::vector<std::pair<std::string, std::string>> lora_modules;
  // Baseline only: static batching (waves, padded to the slowest sequence).
  bool static_batching = false;
  // Seed for requests that bring none.
  uint64_t seed = 0;
  // Intra-op threads (0 = leave libtorch's default).
  int32_t num_threads = 0;
  // Tensor parallelism (docs/design.md §4): the model split over this many ranks, threads of this
  // process (LlmEngine starts them), each on its own device: the CPU, or GPUs device, device + 1,
  // ... Each rank holds its share of the weights and a KV pool of kv_memory_bytes over its heads.
  int32_t tensor_parallel_size = 1;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

}  // namespace crl::engine

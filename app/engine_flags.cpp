#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "app/cli_style.h"
#include "app/commands.h"
#include "common/units.h"
#include "engine/llm_engine.h"
#include "engine/model/model_cache.h"

namespace crl::app {

void add_engine_flags(CLI::App& cmd, EngineFlags& f) {
  auto& c = f.config;
  const std::string previous = cmd.option_defaults()->get_group();
  cmd.option_defaults()->group(kGroupModel);
  cmd.add_option("--model", c.model_dir,
                 "Hugging Face model directory (default: the embedded default model)");
  cmd.add_option("--dtype", c.dtype, "compute dtype: float32 or bfloat16")->capture_default_str();
  cmd.add_option("--device", c.device, "cpu, or cuda (a distributed job gives each rank its own)")
      ->capture_default_str();
  cmd.option_defaults()->group(kGroupEngine);
  cmd.add_option("--kv-memory", f.kv_memory, "KV cache pool size, e.g. 512MiB")
      ->capture_default_str();
  cmd.add_option("--kv-blocks", c.num_kv_blocks, "KV pool size in blocks (overrides --kv-memory)");
  cmd.add_option("--block-size", c.block_size, "tokens per KV block")->capture_default_str();
  cmd.add_option("--max-batched-tokens", c.max_batched_tokens, "token budget of one engine step")
      ->capture_default_str();
  cmd.add_option("--max-seqs", c.max_seqs, "sequences in the running batch at most")
      ->capture_default_str();
  cmd.add_option("--max-model-len", c.max_model_len, "context length (0 = the model's)");
  cmd.add_flag("!--no-prefix-caching", c.enable_prefix_caching, "disable prefix caching");
  cmd.add_flag("--deterministic", c.deterministic,
               "batch-invariant logits (bit-identical whatever the batch; slower)");
  cmd.add_option(
         "--cpu-kernels", c.cpu_kernels,
         "CPU linear layers: auto (the project's kernels for steps of 2+ tokens, where they "
         "beat OpenBLAS) or libtorch (at::linear everywhere)")
      ->check(CLI::IsMember({"auto", "libtorch"}))
      ->capture_default_str();
  cmd.add_option(
         "--gpu-kernels", c.gpu_kernels,
         "GPU elementwise ops: auto (RMSNorm, RoPE, the SiLU gate and plain sampling rows as "
         "fused CUDA kernels) or libtorch (ATen's ops)")
      ->check(CLI::IsMember({"auto", "libtorch"}))
      ->capture_default_str();
  cmd.add_option("--sampler", c.sampler,
                 "auto (on a GPU the tensor sampler: only ids and log-probs leave the device; the "
                 "CPU engine's own sampler on the CPU), tensor, or cpu (logits copied to the host)")
      ->check(CLI::IsMember({"auto", "tensor", "cpu"}))
      ->capture_default_str();
  cmd.add_option("--cuda-graphs", c.cuda_graphs,
                 "decode steps replay CUDA graphs captured at batch-size buckets: auto (on a GPU), "
                 "on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd.option_defaults()->group(kGroupLora);
  cmd.add_option("--max-loras", c.max_loras, "LoRA adapter slots (at least one per --lora)")
      ->capture_default_str();
  cmd.add_option("--max-lora-rank", c.max_lora_rank, "the largest LoRA rank a slot holds")
      ->capture_default_str();
  cmd.add_option("--lora-targets", c.lora_targets,
                 "layers LoRA slots may adapt: all-linear or a list of q,k,v,o,gate,up,down")
      ->capture_default_str();
  cmd.add_option(
      "--lora", f.loras,
      "NAME=DIR: serve the PEFT LoRA adapter in DIR as model NAME (repeatable; a request "
      "picks it by its \"model\" field)");
  cmd.option_defaults()->group(kGroupEngine);
  cmd.add_option("--tensor-parallel-size,--tp", c.tensor_parallel_size,
                 "split the model's heads and MLP over N ranks (threads of this process), each on "
                 "its own device: --device cuda:K uses GPUs K..K+N-1")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd.add_option("--threads", c.num_threads, "intra-op CPU threads (0 = libtorch default)");
  cmd.add_option("--engine-seed", c.seed, "seed for requests that bring none");
  cmd.option_defaults()->group(previous);
}

std::string tensor_parallel_note(const engine::LlmEngine& engine) {
  const int n = engine.config().tensor_parallel_size;
  if (n <= 1) return "";
  int64_t bytes = 0;
  for (const auto& [name, t] : engine.model().named_parameters())
    bytes += t.numel() * t.element_size();
  return " on each of " + std::to_string(n) + " tensor-parallel ranks (over its share of the KV " +
         "heads), and weights of " + format_bytes(static_cast<double>(bytes)) + " a rank";
}

engine::EngineConfig EngineFlags::resolve() {
  engine::EngineConfig c = config;
  check_device_available(c.device);
  if (c.model_dir.empty()) {
    c.model_dir = engine::ensure_preset_model("default");
    spdlog::warn(
        "no --model: the embedded default model, whose weights are random (its text is noise: it "
        "is there for tests and the RL job's built-in task); pass --model DIR for a real model");
  } else {
    check_model_dir("--model", c.model_dir);
  }
  c.kv_memory_bytes = parse_bytes(kv_memory);
  for (const std::string& spec : loras) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == spec.size()) {
      throw std::invalid_argument("--lora '" + spec +
                                  "': expected NAME=DIR (a PEFT adapter directory)");
    }
    c.lora_modules.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
  }
  return c;
}

}  // namespace crl::app

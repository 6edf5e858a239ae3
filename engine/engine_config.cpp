#include "engine/engine_config.h"

#include <stdexcept>
#include <string>

#include "engine/model/lora.h"

namespace crl::engine {

void EngineConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& v, const char* rule) {
    throw std::invalid_argument("invalid engine setting '" + field + "': " + v + " (" + rule + ")");
  };
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "fp32" && dtype != "bf16")
    bad("dtype", dtype, "float32 or bfloat16");
  if (kv_memory_bytes <= 0 && num_kv_blocks <= 0)
    bad("kv_memory_bytes", std::to_string(kv_memory_bytes), "must be > 0");
  if (block_size < 1 || block_size > 1024)
    bad("block_size", std::to_string(block_size), "must be in [1, 1024]");
  if (max_batched_tokens < 1)
    bad("max_batched_tokens", std::to_string(max_batched_tokens), "must be >= 1");
  if (max_seqs < 1) bad("max_seqs", std::to_string(max_seqs), "must be >= 1");
  if (tensor_parallel_size < 1 || tensor_parallel_size > 64)
    bad("tensor_parallel_size", std::to_string(tensor_parallel_size), "must be in [1, 64]");
  if (cpu_kernels != "auto" && cpu_kernels != "libtorch")
    bad("cpu_kernels", cpu_kernels, "auto or libtorch");
  if (gpu_kernels != "auto" && gpu_kernels != "libtorch")
    bad("gpu_kernels", gpu_kernels, "auto or libtorch");
  if (cuda_graphs != "auto" && cuda_graphs != "on" && cuda_graphs != "off")
    bad("cuda_graphs", cuda_graphs, "auto, on or off");
  if (sampler != "auto" && sampler != "tensor" && sampler != "cpu")
    bad("sampler", sampler, "auto, tensor or cpu");
  if (max_loras < 0) bad("max_loras", std::to_string(max_loras), "must be >= 0");
  if (max_lora_rank < 1) bad("max_lora_rank", std::to_string(max_lora_rank), "must be >= 1");
  try {
    parse_lora_targets(lora_targets);
  } catch (const std::invalid_argument& e) {
    bad("lora_targets", lora_targets, e.what());
  }
  if (max_model_len < 0) bad("max_model_len", std::to_string(max_model_len), "must be >= 0");
  if (num_threads < 0) bad("num_threads", std::to_string(num_threads), "must be >= 0");
}

}  // namespace crl::engine

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "engine/model/lora.h"

namespace crl::app {

Runner register_merge_lora(CLI::App& app) {
  struct Flags {
    std::string model, lora, out, dtype = "float32";
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand(
      "merge-lora",
      "write a Hugging Face model directory with a PEFT LoRA adapter merged into the "
      "weights (W + alpha / r * B A), loadable anywhere a model is");
  cmd->add_option("--model", f->model, "the base model directory")->required();
  cmd->add_option("--lora", f->lora,
                  "the PEFT adapter directory (adapter_config.json, "
                  "adapter_model.safetensors)")
      ->required();
  cmd->add_option("--out", f->out, "output directory")->required();
  cmd->add_option("--dtype", f->dtype, "stored dtype: float32 or bfloat16")->capture_default_str();
  return [f]() {
    engine::write_merged_lora_model(f->model, f->lora, f->out, f->dtype);
    spdlog::info("wrote {} with the adapter {} merged to {}", f->model, f->lora, f->out);
    return 0;
  };
}

}  // namespace crl::app

// Training checkpoints: a Hugging Face model directory the engine loads as is, plus the optimizer
// state and step needed to resume (docs/design.md §5).
//
// Layout of a checkpoint directory:
//   config.json, generation_config.json, model.safetensors   the fp32 master weights (engine/
//   tokenizer.json or .model, tokenizer_config.json, ...     model/model_writer's layout)
//   (LoRA: adapter_config.json + adapter_model.safetensors instead, the fp32 adapter as PEFT
//   writes it, base_model_name_or_path = the base model directory; `colocated-rl merge-lora`
//   turns it into a merged model directory)
//   optimizer.safetensors   AdamW exp_avg/<param> and exp_avg_sq/<param>, float32
//   trainer_state.json      {"format": 1, "step", "adam_step", "reference_model_dir", "extra",
//                            "zero_stage", "train_ranks", "layout_hash"}
// The optimizer state is consolidated (gathered from the ZeRO slices), so a run resumes at any
// number of train ranks and any stage: each rank takes its slice of the full tensors.
// The directory is written under <dir>.tmp.<pid> and renamed into place; an existing <dir> is
// first renamed aside and removed after the new one is in place, so a reader sees either the old
// or the new checkpoint, never a partial one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/trainer.h"

namespace crl::trainer {

// Writes `trainer`'s masters, optimizer state and step to `dir` (atomically, see above).
// tokenizer_source: a tokenizer.model file or a model directory whose tokenizer files are copied
// in (write_model_dir); empty = none (the engine then takes token-id prompts only).
// extra: caller state kept verbatim in trainer_state.json (e.g. the data cursor).
// A collective when the trainer's state is sharded: every train rank calls it, the group's rank 0
// writes (the others take part in the gathers and return).
// merged (LoRA only): also write <dir>/merged, a Hugging Face model directory of the base
// (tokenizer_source, which must then be the base model directory) with the adapter merged in.
void save_checkpoint(Trainer& trainer, const std::string& dir, const std::string& tokenizer_source,
                     const nlohmann::json& extra = nlohmann::json::object(), bool merged = false);

struct CheckpointState {
  int64_t step = 0;                 // optimizer steps taken
  std::string reference_model_dir;  // as the saving trainer had it
  nlohmann::json extra;             // the caller's state
  nlohmann::json lora;  // a LoRA run's {"rank", "alpha", "targets", "base_model"}, else null
};

// Reads trainer_state.json of a checkpoint. Throws std::runtime_error naming the file.
CheckpointState read_checkpoint_state(const std::string& dir);
// The largest step a trainer state may name (a damaged or forged file is refused, not replayed).
constexpr int64_t kMaxCheckpointStep = 100'000'000;

// Whether a run with `lora` (LoRA off: full fine-tuning) can resume checkpoint `dir`, whose state
// is `st`: a LoRA checkpoint holds the adapter alone and a full one no adapter, and an adapter
// resumes only with its own rank, alpha and targets. Throws std::invalid_argument saying which
// flags resume it. The job checks it before any rank loads anything; load_trainer_state again.
void check_resume_shape(const CheckpointState& st, const std::string& dir,
                        const LoraTrainOptions& lora);

// Resume: restores optimizer state and step into `trainer`, which must have been created from
// the same checkpoint directory (Trainer(dir, options)), or with LoRA from the run's base model
// (the adapter is read from the checkpoint and must have the trainer's rank, alpha and targets).
// Returns the checkpoint's state.
// With kl_coef > 0, create that trainer with options.reference_model_dir set to the original
// reference (an empty one would make the checkpoint itself the reference).
CheckpointState load_trainer_state(Trainer& trainer, const std::string& dir);

}  // namespace crl::trainer

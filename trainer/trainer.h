// Trainer: one train rank's optimizer loop over the engine's own Transformer (docs/design.md §5
// step 4, §5b).
//
// Owns: the training state in flat buckets (TrainState: compute-dtype parameters, fp32 gradients,
// fp32 masters and AdamW moments, sharded over the train group with --zero 1|2|3), the LR schedule,
// an optional frozen reference Transformer (kl_coef > 0), and the Transformer it runs forward and
// backward through, whose parameters are views into the compute-dtype buffers. Gradients reach the
// buckets through an autograd sink per parameter, in fp32 whatever the compute dtype.
//
// One optimizer step: zero_grad(), accumulate() per micro-batch (loss scaled by the caller),
// finish_step(): the buckets' SUM over the train group (all-reduce, or reduce-scatter with ZeRO),
// times the gradient scale (set_grad_scale; default 1 / group size), global-norm clipping, the
// step's LR, AdamW on the owned slices, all-gather of the updated parameters (stage 3: none; each
// rank keeps its slice). train_step() does all of it. With equal micro-batch counts per rank this
// equals one rank training on all of them.
//
// Collectives: buckets are reduced during backward of a micro-batch passed with last = true (or at
// finish_step). With --zero 2 and 3 every micro-batch is a collective round: every train rank must
// call accumulate()/accumulate_empty() equally often per step. master_weights(), optimizer_state()
// and save_checkpoint() gather over the group when the state is sharded: every train rank calls
// them. At stage 3 (over more than one rank) so are compute_logprobs(), copy_weights_to() and
// gather_buckets(), which gather the parameters.
//
// Deterministic mode matches an engine running with EngineConfig::deterministic bit for bit: the
// same row tiles (TransformerOptions::deterministic), the engine's attention kernel values
// (EngineMatchedAttention) and the engine sampler's log-prob arithmetic (target_logprobs).
//
// Thread safety: one thread per Trainer.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/transformer.h"
#include "engine/model/weight_loader.h"
#include "sync/communicator.h"
#include "trainer/loss.h"
#include "trainer/lr_schedule.h"
#include "trainer/micro_batch.h"
#include "trainer/train_state.h"

namespace crl::engine {
class SafetensorsFile;
}

namespace crl::trainer {

enum class LossKind { kGrpo, kSft };

// LoRA training (issue 29): low-rank adapters on a frozen base. The base stays in the compute
// dtype and takes no gradient; only the adapters' A and B are trainable, so the training state
// (fp32 masters, gradients, AdamW moments, ZeRO slices, the weight-sync buckets) holds the adapter
// alone, under PEFT's tensor names (engine::lora_tensors order). B starts at zero: the first
// forward equals the base's.
struct LoraTrainOptions {
  int64_t rank = 0;                    // 0: full fine-tuning
  double alpha = 32;                   // scaling alpha / rank (LoRA Without Regret's fixed 32)
  std::string targets = "all-linear";  // engine::parse_lora_targets
  double dropout = 0;                  // PEFT's lora_dropout on A's input, gradient passes only
  uint64_t seed = 1;                   // A's initialisation
  bool enabled() const { return rank > 0; }
};

struct TrainerOptions {
  // Compute dtype of forward and backward: "float32" or "bfloat16" (masters stay float32).
  std::string dtype = "float32";
  // Device of the weights, gradients and optimizer state: "cpu" or "cuda[:i]".
  std::string device = "cpu";
  // Bit-exact agreement with an engine in deterministic mode (slower; see the class comment).
  bool deterministic = false;
  // CPU linear layers outside deterministic mode: "libtorch" (at::linear and its autograd) or
  // "project" (float32 forward and backward on the project's kernels, engine::kernel_linear).
  // libtorch is the default: `bench train --cpu-kernels project,libtorch` measured project 8%
  // slower on SmolLM2-135M shapes (1024 tokens a step; the backward's transposed copies cost more
  // than the faster GEMMs save) and within noise on the embedded default model.
  std::string cpu_kernels = "libtorch";
  // Learning-rate schedule (warmup + cosine).
  LrSchedule schedule;
  // AdamW decoupled weight decay, applied to matrices (not norms or biases).
  double weight_decay = 0.0;
  // AdamW betas and epsilon.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adam_eps = 1e-8;
  // Clip the global gradient norm to this (0 = no clipping; the norm is reported either way).
  double max_grad_norm = 1.0;
  // Token cap of one packed micro-batch (--micro-batch-tokens).
  int64_t micro_batch_tokens = 4096;
  // Loss rows whose logits are computed at once (--logits-chunk-tokens): the fp32 logits of a
  // micro-batch's rows beyond this never exist whole, at the cost of recomputing them in backward
  // (head_target_logprobs). 0: as many rows as make 1 GiB of fp32 logits.
  int64_t logits_chunk_tokens = 0;
  // GRPO clip / KL / TIS settings.
  GrpoOptions grpo;
  // Reference model for the KL term; empty = the weights the trainer was created from.
  std::string reference_model_dir;
  // The train group (nullptr: one rank). Not owned; outlives the Trainer.
  sync::Communicator* group = nullptr;
  // ZeRO stage over the group: 0 replicated, 1 sharded optimizer, 2 + sharded gradients, 3 +
  // sharded parameters (each decoder layer's gathered for its forward and again for its
  // backward; the embedding, final norm and head for the whole micro-batch);
  // -1: 2 with more than one rank in the group, else 0 (resolved by the Trainer).
  int zero_stage = -1;
  // Stage 3: gather the next decoder layer's parameters while the current one computes (forward
  // and backward; FSDP2's prefetch of one). Off: each layer's gather waits when it is needed.
  bool zero3_prefetch = true;
  // Recompute each decoder layer's activations in backward (peak ~ one layer's per micro-batch).
  bool activation_checkpointing = false;
  // fp32 masters and Adam moments in host memory; AdamW steps there.
  bool offload_optimizer = false;
  // Cap of one flat bucket (the weight sync's --bucket-bytes, so the layouts agree).
  int64_t grad_bucket_bytes = int64_t{64} << 20;
  // LoRA instead of full fine-tuning (rank > 0).
  LoraTrainOptions lora;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

// Called once per optimizer step on every train rank (it may run collectives): the factor the
// summed gradient is multiplied by.
using GradScale = std::function<double()>;

// What one optimizer step did.
struct StepStats {
  int64_t step = 0;      // optimizer steps taken after this one (1 for the first)
  double lr = 0;         // learning rate used
  double grad_norm = 0;  // global norm before clipping (after the all-reduce)
  LossMetrics loss;      // loss/KL: mean over micro-batches; clip fraction and gap mean:
                         // token-weighted; gap max: max
  int64_t num_micro_batches = 0;
  int64_t num_tokens = 0;       // tokens forwarded
  int64_t num_loss_tokens = 0;  // completion tokens
  double seconds = 0;           // wall time of the step
};

class Trainer {
 public:
  // Loads config.json and the checkpoint from a Hugging Face directory (the engine's format).
  Trainer(const std::string& model_dir, TrainerOptions options);
  // From weights in memory (model_param_specs order). The reference model is loaded from
  // options.reference_model_dir, else copied from `weights`.
  Trainer(engine::ModelConfig config, engine::NamedTensors weights, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void set_grad_scale(GradScale fn);

  // zero_grad + accumulate over `batches` + finish_step.
  StepStats train_step(const std::vector<MicroBatch>& batches, LossKind kind);

  // Lower-level pieces of train_step.
  void zero_grad();
  // Forward + backward of one micro-batch, loss scaled by `scale`; returns its metrics. `last`:
  // the step's last micro-batch, so its backward starts the gradient reductions.
  LossMetrics accumulate(const MicroBatch& batch, LossKind kind, double scale, bool last = false);
  // A round without a micro-batch (zero stages 2 and 3: matches another rank's extra micro-batch;
  // stage 3 runs a two-token micro-batch whose loss is scaled by 0, so its gathers match too).
  void accumulate_empty();
  // Reduce, scale, clip, LR, AdamW step, all-gather. Returns step, lr and grad_norm.
  // `advance_schedule` false: an update inside a step (PPO mini-batches) at the same learning rate
  // as the next, and step() stays (AdamW's own count, for its bias correction, advances always).
  StepStats finish_step(bool advance_schedule = true);

  // Trainer log-probs [N] of the batch's loss tokens at the current weights (no grad), at the
  // GRPO scoring temperature (options().grpo.temperature).
  at::Tensor compute_logprobs(const MicroBatch& batch) const;

  // Writes the current parameters into `model`'s in place (cast to its dtype), so views into sync
  // buckets stay valid. REQUIRES: same architecture. The caller bumps the version.
  void copy_weights_to(engine::Transformer& model) const;

  // Compute-dtype parameters (full on every rank), model_param_specs order; views into buckets().
  // Stage 3: their memory exists only between gather_buckets() and release_buckets().
  const engine::NamedTensors& parameters() const;
  // The parameters' flat buffers in the weight-sync layout (uint8, layout().buckets() order).
  const std::vector<at::Tensor>& buckets() const;
  // Stage 3: gathers every bucket over the group (a collective: every train rank calls it) and
  // keeps those keep(b) says until release_buckets(), one bucket at a time beyond them. No-ops at
  // stages 0-2, whose buckets are always whole.
  void gather_buckets(const std::function<bool(int64_t)>& keep);
  // The same a run of parameters at a time (a streamed weight update, sync::SendStream): gathers
  // the buckets holding parameters [first, end) (model_param_specs order) not gathered yet and
  // drops the kept ones whose parameters all lie before `first` (TrainState::acquire_parameters).
  void gather_parameters(int64_t first, int64_t end, const std::function<bool(int64_t)>& keep);
  void release_buckets();
  // Stage 3: the most bytes of gathered parameters the last weight update held (0 otherwise).
  int64_t update_gathered_peak() const;
  bool parameters_sharded() const;
  const sync::WeightLayout& layout() const;
  // Persistent training-state bytes of this rank by kind.
  StateBytes state_bytes() const;
  // Stage 3: buckets whose gather was started ahead of their layer (zero3_prefetch), so far, and
  // of those the ones their layer found still in flight or done (not gathered again).
  int64_t prefetched_buckets() const;
  int64_t prefetches_used() const;
  // Bytes the KL reference holds beyond the trainer's own tensors (0 without one): a full copy
  // for full fine-tuning, only the adapter's frozen copy where a LoRA reference shares the base
  // (also a resumed LoRA run whose reference_model_dir is the base it adapts).
  int64_t reference_bytes() const;
  // The train group's rank 0 (or a single rank): the one that writes checkpoints.
  bool is_group_leader() const;

  // fp32 master weights, model_param_specs order (copies); with LoRA the adapter's A and B
  // (engine::lora_tensors order and names). Gathered over the group when sharded: every train rank
  // calls it; `keep` false takes part and returns nothing.
  engine::NamedTensors master_weights(bool keep = true);
  // LoRA: the adapter of the fp32 masters (a collective as master_weights; empty A/B when !keep).
  // REQUIRES: options().lora.enabled().
  engine::LoraAdapter lora_adapter(bool keep = true);
  // The frozen base weights the model computes with (compute dtype; with full fine-tuning the
  // trained parameters themselves, whose memory at stage 3 exists only while gathered),
  // model_param_specs order.
  const engine::NamedTensors& model_weights() const;
  const engine::ModelConfig& config() const;
  const TrainerOptions& options() const { return options_; }
  int64_t step() const { return step_; }

  // Optimizer state as named full float32 tensors ("exp_avg/<param>", "exp_avg_sq/<param>") plus
  // the AdamW step count; empty before the first step. Gathered like master_weights().
  engine::NamedTensors optimizer_state(int64_t* adam_step, bool keep = true);
  // Restores state saved by optimizer_state() into a safetensors file (from any number of train
  // ranks: each rank reads only its slices out of the mapped file) and the trainer's step counter.
  // A file without tensors is a fresh state. Throws std::invalid_argument naming a missing or
  // mis-shaped tensor.
  void load_optimizer_state(const engine::SafetensorsFile& saved, int64_t adam_step, int64_t step);
  // Replaces the fp32 masters (and parameters) by `weights` (master_weights()' order, full). With
  // LoRA and a KL reference made from the trainer's own weights, the reference takes the loaded
  // adapter too (the reference is the weights the run starts training from).
  void load_master_weights(const engine::NamedTensors& weights);

 private:
  struct Impl;
  void init(engine::ModelConfig config, engine::NamedTensors weights,
            bool reference_is_base = false);
  // Rows' hidden states -> logits -> log-probs of the loss tokens under softmax(logits /
  // temperature), through `model`. With entropy_sum: adds the loss rows' summed entropies
  // (target_logprobs).
  at::Tensor forward_logprobs(const engine::Transformer& model, const MicroBatch& batch,
                              double temperature, double* entropy_sum = nullptr) const;

  TrainerOptions options_;
  std::unique_ptr<Impl> impl_;
  int64_t step_ = 0;
};

}  // namespace crl::trainer

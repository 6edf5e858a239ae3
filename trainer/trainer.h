// Trainer: one train rank's optimizer loop over the engine's own Transformer (DESIGN.md §5 step 4).
//
// Owns: fp32 master weights (leaf tensors with requires_grad, in model_param_specs order), their
// gradients as views into flat fp32 gradient buckets, a torch AdamW over the masters (weight decay
// on matrices only), the LR schedule, an optional frozen reference Transformer (kl_coef > 0), and
// the Transformer it runs forward/backward through. With dtype float32 that Transformer's
// parameters *are* the masters; with bfloat16 it computes on bf16 casts of the masters, rebound
// before every micro-batch, so gradients land in fp32.
//
// One optimizer step: zero_grad(), accumulate() per micro-batch (loss scaled by 1 / number of
// micro-batches of this rank), finish_step(): the data-parallel hook gets the flat gradient
// buckets once, must leave in each the SUM over the train group (c10d all_reduce SUM semantics),
// the trainer divides by dp_world_size, clips by global norm, sets the step's LR and steps AdamW.
// train_step() does all of it. With equal micro-batch counts per rank this equals one rank
// training on all the micro-batches.
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
#include "trainer/loss.h"
#include "trainer/lr_schedule.h"
#include "trainer/micro_batch.h"

namespace crl::trainer {

enum class LossKind { kGrpo, kSft };

struct TrainerOptions {
  // Compute dtype of forward and backward: "float32" or "bfloat16" (masters stay float32).
  std::string dtype = "float32";
  // Device of the weights, gradients and optimizer state: "cpu" or "cuda[:i]".
  std::string device = "cpu";
  // Bit-exact agreement with an engine in deterministic mode (slower; see the class comment).
  bool deterministic = false;
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
  // GRPO clip / KL / TIS settings.
  GrpoOptions grpo;
  // Reference model for the KL term; empty = the weights the trainer was created from.
  std::string reference_model_dir;
  // Ranks in the train group; gradients are divided by it after the all-reduce hook.
  int64_t dp_world_size = 1;
  // Cap of one flat gradient bucket handed to the all-reduce hook.
  int64_t grad_bucket_bytes = int64_t{64} << 20;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

// The data-parallel seam: called once per optimizer step with the flat float32 gradient buckets;
// must replace each in place by its sum over the train group.
using GradAllReduce = std::function<void(std::vector<at::Tensor>& grad_buckets)>;

// What one optimizer step did.
struct StepStats {
  int64_t step = 0;        // optimizer steps taken after this one (1 for the first)
  double lr = 0;           // learning rate used
  double grad_norm = 0;    // global norm before clipping (after the all-reduce)
  LossMetrics loss;        // loss/KL: mean over micro-batches; clip fraction and gap mean:
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

  void set_grad_all_reduce(GradAllReduce fn);

  // zero_grad + accumulate over `batches` + finish_step.
  StepStats train_step(const std::vector<MicroBatch>& batches, LossKind kind);

  // Lower-level pieces of train_step.
  void zero_grad();
  // Forward + backward of one micro-batch, loss scaled by `scale`; returns its metrics.
  LossMetrics accumulate(const MicroBatch& batch, LossKind kind, double scale);
  // All-reduce hook, divide, clip, LR, AdamW step. Returns step, lr and grad_norm.
  StepStats finish_step();

  // Trainer log-probs [N] of the batch's loss tokens at the current weights (no grad).
  at::Tensor compute_logprobs(const MicroBatch& batch) const;

  // Writes the current masters into `model`'s parameters in place (cast to its dtype), so views
  // into sync buckets stay valid. REQUIRES: same architecture. The caller bumps the version.
  void copy_weights_to(engine::Transformer& model) const;

  // fp32 master weights, model_param_specs order (do not modify).
  const engine::NamedTensors& master_weights() const;
  const engine::ModelConfig& config() const;
  const TrainerOptions& options() const { return options_; }
  int64_t step() const { return step_; }

  // Optimizer state as named float32 tensors ("exp_avg/<param>", "exp_avg_sq/<param>") plus the
  // AdamW per-parameter step count; empty before the first step.
  engine::NamedTensors optimizer_state(int64_t* adam_step) const;
  // Restores state saved by optimizer_state() and the trainer's step counter. Throws
  // std::invalid_argument naming a missing or mis-shaped tensor.
  void load_optimizer_state(const engine::NamedTensors& state, int64_t adam_step, int64_t step);

 private:
  struct Impl;
  void init(engine::ModelConfig config, engine::NamedTensors weights);
  // Rows' hidden states -> logits -> log-probs of the loss tokens, through `model`.
  at::Tensor forward_logprobs(const engine::Transformer& model, const MicroBatch& batch) const;

  TrainerOptions options_;
  std::unique_ptr<Impl> impl_;
  int64_t step_ = 0;
};

}  // namespace crl::trainer

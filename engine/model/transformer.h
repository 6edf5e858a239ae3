// Transformer: the Llama-family decoder (RMSNorm, RoPE with linear/llama3 scaling, GQA, SwiGLU,
// optional qkv bias, tied embeddings), written once for the engine and the trainer.
//
// Owns: its weights as plain at::Tensors in model_param_specs() order (the trainer may set
// requires_grad on them; weight sync may replace them with views of its bucket buffers through
// set_parameter). Forward works on a packed batch of T tokens with explicit positions; attention
// is delegated to an AttentionBackend, so the same code runs paged (engine) or dense (trainer).
//
// Deterministic mode (CPU only): the row-wise parts of the network (norms, projections, the SiLU
// gate, lm_head) run on the project's batch-invariant kernels (engine/kernels/batch_invariant.h),
// which compute every row with a reduction order fixed by their code; the remaining ops are
// elementwise or row-gathers, and the attention backends compute each row on its own. A token's
// logits then do not depend on the other tokens in the batch, on chunking or on prefix-cache hits,
// nor on which CPU kernel path (AVX-512, AVX2, scalar) runs.
//
// Thread safety: forward is const on the weights; one caller at a time per backend.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/attention.h"
#include "engine/model/config.h"
#include "engine/model/lora.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/weight_loader.h"

namespace crl::engine {

struct TransformerOptions {
  // Compute dtype: float32 or bfloat16 (weights are converted to it).
  at::ScalarType dtype = at::kFloat;
  // Device the weights live on.
  at::Device device = at::kCPU;
  // Batch-invariant row-wise computation (see the class comment).
  bool deterministic = false;
  // Outside deterministic mode, linear layers on the CPU run the project's kernels instead of
  // at::linear where they are faster, when no autograd graph is needed (EngineConfig::cpu_kernels):
  // float32 from 2 rows on an AVX2 or AVX-512 path (kernels::bi_linear), bfloat16 from 3 rows on
  // AVX512-BF16 (kernels::bf16_dot_linear); RMSNorm and the SiLU gate on a vector path
  // (kernels::bi_rms_norm, bi_silu_mul).
  bool project_linear = false;
  // On a CUDA device, RMSNorm, RoPE and the SiLU gate run the project's fused kernels
  // (engine/kernels/cuda_ops.h) where no autograd graph is needed; else ATen's composition.
  bool cuda_fused = true;
  // The engine (no autograd graph), outside deterministic mode: q/k/v and gate/up run as one
  // product each (vLLM's merged projections: one pass over the input and one kernel where there
  // were three and two; the parts are column ranges of its output, which the SiLU gate and the
  // CUDA RoPE read in place). The weights stay separate named tensors (what the sync layout and the
  // trainer see), laid out back to back in memory: the constructor packs each group so, and a
  // layer keeps its merged products while both groups stay adjacent (in the engine's sync buckets
  // they do where the layout puts them back to back in one bucket: not with q/k/v biases, which
  // model_param_specs interleaves); a layer whose group lies apart runs five products.
  bool merge_projections = false;
};

class Transformer {
 public:
  // `weights` must match model_param_specs(config) in names and shapes (checked, naming the
  // tensor). `vocab`: the rows of the vocabulary the embedding and LM head hold (a tensor-parallel
  // shard's, tp_vocab_range); default (rows 0): all of them.
  Transformer(ModelConfig config, NamedTensors weights, TransformerOptions options,
              VocabRange vocab = {});
  // Loads config.json and the safetensors checkpoint from a Hugging Face directory.
  static Transformer load(const std::string& dir, TransformerOptions options);
  // The same, keeping tensor-parallel shard `shard` of it (engine/model/tensor_parallel.h): its
  // config() is the shard's local one. Its forward needs set_row_parallel_reduce() when
  // shard.size > 1.
  static Transformer load(const std::string& dir, TransformerOptions options, const TpShard& shard);

  // tokens, positions: [T] int64 on the model's device; `max_position`: the largest of
  // `positions`, known to the caller on the host (checked against max_position_embeddings, so the
  // forward never reads device memory back). Returns the final-normed hidden states [T, hidden]
  // (compute dtype). `lora`: the rows' LoRA slots (of set_lora_slots); default: none. With a split
  // vocabulary the embedding's rows are summed over the group (set_row_parallel_reduce).
  at::Tensor forward_hidden(const at::Tensor& tokens, const at::Tensor& positions,
                            AttentionBackend& attention, int64_t max_position,
                            const LoraBatch& lora = {}) const;
  // hidden: [R, hidden] -> logits [R, vocab] float32; with a split vocabulary this shard's columns
  // [vocab_range().start, + rows) of them (ModelRunner gathers the group's).
  at::Tensor compute_logits(const at::Tensor& hidden) const;
  // The same through `lm_head` [vocab, hidden] in place of the bound head (e.g. a leaf that
  // collects the head's gradient over chunks of rows).
  at::Tensor compute_logits(const at::Tensor& hidden, const at::Tensor& lm_head) const;
  // The LM head's weight as bound (the embedding where tied; a gradient sink during a trainer's
  // micro-batch).
  const at::Tensor& lm_head() const { return lm_head_; }

  // Full forward over packed, independent sequences (positions restart at 0 for each): logits
  // [sum(lens), vocab] float32. The no-cache reference and the trainer's forward.
  at::Tensor forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens) const;

  const ModelConfig& config() const { return config_; }
  // The vocabulary rows of the embedding and the LM head: [0, vocab_size) unless a tensor-parallel
  // shard splits it (splits_vocab()).
  const VocabRange& vocab_range() const { return vocab_; }
  bool splits_vocab() const { return vocab_.rows != config_.vocab_size; }
  const TransformerOptions& options() const { return options_; }
  // Parameters in model_param_specs order (embedding first; lm_head last unless tied).
  const NamedTensors& named_parameters() const { return params_; }
  // Replaces parameter `name` by `value` (same shape and dtype, e.g. a view into a sync bucket).
  void set_parameter(const std::string& name, const at::Tensor& value);
  // Replaces every parameter at once; `values` in named_parameters() order, same names, shapes,
  // dtypes and device (throws std::invalid_argument naming the first mismatch).
  void set_parameters(const NamedTensors& values);
  // The same for parameters [first, first + values.size()) alone (a trainer binding one decoder
  // layer's gradient sinks just before the layer runs).
  void set_parameters(size_t first, const NamedTensors& values);
  // Enables or disables deterministic (batch-invariant) mode (CPU only: throws on another device).
  void set_deterministic(bool on);
  // Layers whose q/k/v (with their biases) and gate/up each run as one product now
  // (TransformerOptions::merge_projections; 0 without it).
  int64_t merged_layers() const;

  // One decoder layer of forward_hidden as a function of its input hidden states. It owns what it
  // needs except the AttentionBackend, which must outlive it.
  using LayerFn = std::function<at::Tensor(const at::Tensor& h)>;
  // Runs layer `index`: the default calls `layer(h)`; a trainer may wrap it (e.g. recompute it in
  // backward). Empty = the default.
  using LayerRunner =
      std::function<at::Tensor(int64_t index, const at::Tensor& h, std::shared_ptr<LayerFn> layer)>;
  void set_layer_runner(LayerRunner runner) { layer_runner_ = std::move(runner); }
  // Tensor parallelism: called in place on o_proj's and down_proj's partial outputs [T, hidden]
  // before each residual add (the group's sum); empty = none.
  using RowParallelReduce = std::function<void(const at::Tensor&)>;
  void set_row_parallel_reduce(RowParallelReduce reduce) { row_reduce_ = std::move(reduce); }
  // The LoRA adapters forward_hidden's `lora` selects from (nullptr = none); not owned.
  void set_lora_slots(const LoraSlots* slots) { lora_ = slots; }
  // A trainable adapter on every row (the trainer's LoRA; nullptr = none; not owned): each target
  // layer adds linear(linear(dropout(x), A), B * scaling), the arithmetic of an engine slot (B
  // scaled first), so a no-grad pass matches an engine serving the same adapter. A and B may be
  // autograd outputs; dropout (PEFT's lora_dropout, on A's input) runs only where grad mode is on.
  void set_adapter(const LoraAdapter* adapter, double dropout = 0) {
    adapter_ = adapter;
    adapter_dropout_ = dropout;
  }

 private:
  struct Layer {
    at::Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias;
    at::Tensor q_norm, k_norm;  // Qwen3: per-head RMSNorm weights [head_dim]
    at::Tensor post_norm, gate_proj, up_proj, down_proj;
    // Views over the adjacent q/k/v weights (and biases) and gate/up weights; undefined when a
    // group is not back to back in memory or projections are not merged.
    at::Tensor qkv_proj, qkv_bias, gate_up_proj;
  };

  // A forward's inputs every layer reads: the positions, their RoPE cos and sin rows in the compute
  // dtype (undefined where the fused CUDA kernel reads the tables itself), and the LoRA row mask.
  struct Rope {
    at::Tensor positions, cos, sin;
    LoraBatch lora;
  };

  void bind_parameters();
  // merge_projections: copies each layer's q/k/v weights, their biases and gate/up weights that do
  // not lie back to back into one tensor each, the parameters becoming views of it.
  void pack_merged_projections();
  bool merges_projections() const;
  at::Tensor layer_forward(int64_t li, const at::Tensor& h, const Rope& rope,
                           AttentionBackend& attention) const;
  // Whether the fused CUDA kernels may run on `ts` (a CUDA build and device, no autograd graph).
  bool cuda_fused_fits(std::initializer_list<const at::Tensor*> ts) const;
  // The row-wise ops, through the batch-invariant kernels in deterministic mode.
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                    const at::Tensor& bias = {}) const;
  at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) const;
  at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  // linear(x, weight, bias) plus layer `li`'s LoRA delta for target `t` where the mask selects one.
  at::Tensor adapted_linear(int64_t li, LoraTarget t, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const LoraBatch& lora) const;
  // Whether adapted_linear runs the engine slots' delta inside the base product (the float32
  // kernel's second depth segment; not in deterministic mode, not with a trainer adapter there).
  bool fuses_lora(int64_t li, LoraTarget t, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias, const LoraBatch& lora) const;

  ModelConfig config_;
  TransformerOptions options_;
  VocabRange vocab_;
  NamedTensors params_;
  at::Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  at::Tensor rope_cos_, rope_sin_;  // [max_positions, head_dim / 2] float32
  LayerRunner layer_runner_;
  RowParallelReduce row_reduce_;
  const LoraSlots* lora_ = nullptr;
  const LoraAdapter* adapter_ = nullptr;
  double adapter_dropout_ = 0;
};

// RoPE inverse frequencies [head_dim / 2] for the config's rope_theta and rope_scaling.
at::Tensor rope_inv_freq(const ModelConfig& config);

}  // namespace crl::engine

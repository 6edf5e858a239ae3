// LoRA adapters: low-rank updates W + (alpha / r) B A of a frozen base model's linear layers, in
// PEFT's on-disk format, and the engine's slots that serve several of them unmerged at once.
//
// Serving unmerged: LoraSlots stacks every slot's A of one target layer into [S * r, in] and its
// B, scaled by alpha / r, into [out, S * r] (an adapter of smaller rank zero-padded: exact). A
// batch whose rows use different slots (or none) adds to each target layer's output
//   ((x A_all^T) * mask) B_all^T,   mask [T, S * r]: 1 in the columns of the row's own slot,
// two products per target layer for the whole batch, no per-adapter sub-batches, and nothing
// gathered per row. Through the model's own linear (Transformer), so deterministic mode stays
// batch-invariant with adapters.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/weight_loader.h"

namespace crl::engine {

// The linear layers an adapter can target, in PEFT's module names.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumLoraTargets = 7;
const char* lora_target_name(LoraTarget t);  // "q_proj", ... "down_proj"
// "all-linear", or a comma list of q,k,v,o,gate,up,down (or their *_proj names). Throws
// std::invalid_argument naming the entry it does not know.
std::vector<LoraTarget> parse_lora_targets(const std::string& spec);
// (in_features, out_features) of a target layer.
std::pair<int64_t, int64_t> lora_target_shape(const ModelConfig& config, LoraTarget t);

struct LoraAdapter {
  int64_t rank = 0;
  double alpha = 0;
  std::vector<LoraTarget> targets;
  // [layer][target]: A [rank, in] and B [out, rank], float32 on the CPU; undefined off-target.
  std::vector<std::array<at::Tensor, kNumLoraTargets>> a, b;

  double scaling() const { return alpha / static_cast<double>(rank); }
  bool has(LoraTarget t) const;
  // PEFT's tensor name of layer `li`'s target `t`, A or B
  // (base_model.model.model.layers.{li}.self_attn.q_proj.lora_A.weight, ...).
  static std::string peft_name(int64_t li, LoraTarget t, bool is_a);
};

// An adapter of `config`'s shapes: A ~ N(0, 1 / in) (std 1/sqrt(in): sqrt(3) times PEFT's
// kaiming_uniform(a=sqrt(5)), U(+-1/sqrt(in)); the learning rates the README recommends were
// found with this scale), B zero (the
// training start: outputs equal the base's) or, with `random_b`, N(0, 0.02). Deterministic in seed.
LoraAdapter make_lora_adapter(const ModelConfig& config, int64_t rank, double alpha,
                              const std::vector<LoraTarget>& targets, uint64_t seed, bool random_b);

// The adapter's tensors in the one order the trainer's state, the weight sync and the engine's
// receive buffers share: layer by layer, targets in LoraTarget order, A then B, under PEFT's names.
NamedTensors lora_tensors(const LoraAdapter& adapter);
// An adapter with `like`'s rank, alpha and targets whose A and B are `tensors` (lora_tensors'
// order and names, any dtype and device; kept as given, not copied). Throws std::invalid_argument
// naming the first tensor that is missing, misnamed or of the wrong shape.
LoraAdapter lora_with_tensors(const LoraAdapter& like, const NamedTensors& tensors);

// Reads a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors). Throws
// std::invalid_argument naming the file and tensor when the adapter does not fit `config`: another
// peft_type, a missing or unknown target, a tensor of the wrong shape or layer count, rank-less
// config. Tensors named with or without PEFT's "base_model.model." prefix are accepted.
LoraAdapter load_peft_adapter(const std::string& dir, const ModelConfig& config);
// Writes `adapter` as PEFT does (atomically per file), loadable by PEFT and by load_peft_adapter.
void save_peft_adapter(const LoraAdapter& adapter, const std::string& dir,
                       const std::string& base_model_name = "");

// The base weights (model_param_specs order) with `adapter` merged in: W + scaling * B A, in each
// weight's dtype. The reference for unmerged serving, and a merged checkpoint's weights.
NamedTensors merge_lora(const NamedTensors& base, const LoraAdapter& adapter,
                        const ModelConfig& config);

// Rows [begin, end) of a forward, all on LoRA slot `slot` (-1: none).
struct LoraRowRun {
  int64_t begin = 0, end = 0;
  int32_t slot = -1;
};

// A forward's adapters: every row on one slot (`slot`; the slot's own A and B, no mask) or rows on
// different slots or none (`mask`, LoraSlots::row_mask); neither = no adapter. With a mask, `runs`
// may also give the rows as runs of one slot each (in order, covering every row): where the
// project's float32 kernel runs a target layer outside deterministic mode, each run then reads its
// own slot's A and B alone (kernels::bi_grouped_linear and the grouped bi_linear) instead of every
// slot's columns under the mask.
struct LoraBatch {
  at::Tensor mask;
  int32_t slot = -1;
  std::vector<LoraRowRun> runs;
  bool active() const { return mask.defined() || slot >= 0; }
};

// `row_slots` (each forward row's slot, -1 for none) as runs of equal slots, in order.
std::vector<LoraRowRun> lora_row_runs(const std::vector<int32_t>& row_slots);

// Writes a Hugging Face model directory to `out_dir`: the model in `model_dir` with the PEFT
// adapter in `lora_dir` merged into its weights (merge_lora), stored in `dtype` ("float32" or
// "bfloat16"), its config and tokenizer files copied. Throws as load_peft_adapter and
// write_model_dir do.
void write_merged_lora_model(const std::string& model_dir, const std::string& lora_dir,
                             const std::string& out_dir, const std::string& dtype = "float32");

class LoraSlots {
 public:
  // `targets`: the layers slots may adapt (an adapter targeting another one is refused).
  LoraSlots(const ModelConfig& config, int64_t num_slots, int64_t max_rank,
            std::vector<LoraTarget> targets, at::ScalarType dtype, at::Device device);

  // Copies `adapter` into `slot` (its B scaled by alpha / r); the slot's previous contents are
  // replaced. Throws std::invalid_argument for a rank above max_rank, a target outside the slots'
  // targets, or shapes that do not fit the model.
  void load(int64_t slot, const LoraAdapter& adapter);
  // Zeroes `slot`.
  void clear(int64_t slot);

  int64_t num_slots() const { return num_slots_; }
  int64_t max_rank() const { return max_rank_; }
  bool targets(LoraTarget t) const { return enabled_[static_cast<int>(t)]; }
  // Stacked A [S * r, in] and scaled B [out, S * r] of layer `li`'s target `t` (defined when
  // targets(t)).
  const at::Tensor& a(int64_t li, LoraTarget t) const { return a_[li][static_cast<int>(t)]; }
  const at::Tensor& b(int64_t li, LoraTarget t) const { return b_[li][static_cast<int>(t)]; }
  // One slot's A [r, in] (a view of a()) and scaled B [out, r] (its own contiguous copy; with one
  // slot, b() itself).
  at::Tensor slot_a(int64_t li, LoraTarget t, int64_t slot) const {
    return a_[li][static_cast<int>(t)].narrow(0, slot * max_rank_, max_rank_);
  }
  const at::Tensor& slot_b(int64_t li, LoraTarget t, int64_t slot) const {
    return slot_b_[static_cast<size_t>(slot)][li][static_cast<int>(t)];
  }
  // The batch's mask [rows, S * r] in the model's dtype and device (with `on_host`, on the CPU):
  // row i's slot's columns 1 (row_slots[i] in [0, S)), the rest 0 (a row of slot -1 takes no
  // adapter).
  at::Tensor row_mask(const std::vector<int32_t>& row_slots, bool on_host = false) const;

 private:
  ModelConfig config_;
  int64_t num_slots_, max_rank_;
  std::array<bool, kNumLoraTargets> enabled_{};
  at::ScalarType dtype_;
  at::Device device_;
  std::vector<std::array<at::Tensor, kNumLoraTargets>> a_, b_;
  std::vector<std::vector<std::array<at::Tensor, kNumLoraTargets>>>
      slot_b_;  // [slot][layer][target]
};

}  // namespace crl::engine

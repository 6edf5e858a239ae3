// MemoryPlan: what each device of a node holds in the RL job, from the model's config.json and the
// flags, before any rank loads anything (docs/design.md §5), so a job that cannot fit is refused
// at start naming the numbers rather than failing with an out-of-memory error minutes later.
//
// Per device (a GPU, or the host on --device cpu), summed over the ranks placed on it:
//   engine weights  every engine's weights in the engine dtype
//   KV pools        every engine's --kv-memory (held during rollouts)
//   trainer state   parameters in the compute dtype, fp32 gradients, fp32 masters (unless they are
//                   the fp32 parameters themselves) and AdamW's two moments, sharded by the ZeRO
//                   stage over the train group (stage 1: masters and moments; 2: gradients too;
//                   3: parameters too, plus the embedding/norm/head and two decoder layers
//                   gathered), optimizer state on the host with --offload-optimizer; a KL
//                   reference's copy.
//                   LoRA: the base in the compute dtype, the state of the adapter alone.
//   activations     one micro-batch's saved activations (--micro-batch-tokens; one layer's with
//                   activation checkpointing; on the CPU also the dense attention's fp32
//                   probabilities, sequences as long as the context or --max-episode-tokens
//                   allow) and the fp32 logits, log-probs and their gradient
//                   of one chunk of its loss rows (--logits-chunk-tokens; chunked, the trained
//                   head's gradient sum in fp32 and a chunk's in the compute dtype) (held during
//                   training): an estimate, not a measurement
//   CUDA contexts   ~0.5 GiB for each process on a GPU
// The peak is everything at once, except with the colocated hand-over (RlOptions::kv_handover) on a
// device holding one engine and one trainer, where the KV pool and the activations take turns:
// peak = the rest + max(KV pool, activations).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "sync/placement.h"
#include "trainer/rl_context.h"

namespace crl::trainer {

struct DeviceMemory {
  std::string device;  // "cuda:N" or "cpu"
  int engines = 0, trainers = 0;
  int64_t engine_weights = 0, kv_pools = 0, trainer_state = 0, activations = 0, contexts = 0;
  // ZeRO-3: the most bytes a trainer gathers for a weight update and holds until sent: one run of
  // --sync-chunk-mb's buckets it keeps, and up to two buffers more (between steps, so in place of
  // its activations, not beside them).
  int64_t sync_gathered = 0;
  int64_t peak(bool handover) const;
};

struct MemoryPlan {
  std::vector<DeviceMemory> devices;  // node 0's (every node is laid out the same)
  bool handover = false;

  // The table world rank 0 prints: one row per device, its peak and, where known, its capacity.
  std::string table(const std::vector<int64_t>& capacity = {}) const;
  // Throws std::invalid_argument naming the device, its peak, what makes it up and the capacity
  // when a device's peak exceeds capacity[i] (bytes, by devices' order; <= 0: unknown).
  void check_fits(const std::vector<int64_t>& capacity) const;
  // The device with the largest peak (devices must not be empty).
  const DeviceMemory& largest() const;
};

// A change of the flags and the plan's largest peak with it.
struct PlanFix {
  std::string flags;  // e.g. "--activation-checkpointing" or "--kv-memory 12GiB"
  int64_t peak = 0;
};

// Changes of the flags that make every device's peak fit `capacity` (bytes, each device alike),
// each on top of `options`: --zero 2 (more than one train rank and a lower stage asked),
// --activation-checkpointing, --offload-optimizer, --micro-batch-tokens (the largest power of 2
// below today's that fits, at least 256 and above --max-tokens; with the largest --kv-memory that
// then fits if need be), --kv-memory (the largest whole GiB that fits, at least 1 GiB), --lora-rank
// 16; where none of these fits, the first four and --lora-rank 16 stacked one after another, each
// time also with the --kv-memory or --micro-batch-tokens that then fits. Empty: none found.
std::vector<PlanFix> plan_fixes(const engine::ModelConfig& config, const RlOptions& options,
                                const sync::Placement& placement, int64_t capacity);

// Bytes one train rank holds of the trainer's state (see above); `train_ranks` is the train
// group's size (every node's train ranks).
int64_t trainer_state_bytes(const engine::ModelConfig& config, const TrainerOptions& trainer,
                            int train_ranks);
// Bytes of one micro-batch's activations (an estimate; see above). Off CUDA the trainer's
// attention is dense and keeps each sequence's [heads, L, L] probabilities: `longest_sample`
// bounds L (<= 0: the micro-batch, a micro-batch of one sequence).
int64_t activation_bytes(const engine::ModelConfig& config, const TrainerOptions& trainer,
                         int64_t longest_sample = 0);

MemoryPlan plan_memory(const engine::ModelConfig& config, const RlOptions& options,
                       const sync::Placement& placement);
// Each device's memory, by plan.devices' order: a GPU's total (no CUDA context is made), the host's
// physical memory for "cpu"; 0 where it cannot be read.
std::vector<int64_t> device_capacities(const MemoryPlan& plan);

}  // namespace crl::trainer

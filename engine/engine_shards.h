// How an engine builds its model and KV pool, whole or as a tensor-parallel shard (docs/design.md
// §4): LlmEngine's constructor and LlmEngine::follow share these, and an engine with
// EngineConfig::tensor_parallel_size > 1 starts its follower threads through LocalTpFollowers.
//
// Thread safety: free functions of their arguments; a LocalTpFollowers is owned by one engine.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_config.h"
#include "engine/model/transformer.h"
#include "engine/model_runner.h"
#include "sync/tp_group.h"

namespace crl::engine {

TransformerOptions engine_model_options(const EngineConfig& config);

// A group of more than one rank (a split engine).
bool tensor_parallel(const sync::TpGroup* tp);

// What a split engine does not do yet (LoRA adapters, CUDA graphs forced on):
// std::invalid_argument.
void refuse_for_tensor_parallel(const EngineConfig& config);

// The engine's model: the whole checkpoint, or `tp`'s rank's shard of it whose row-parallel outputs
// are summed over the group (engine/model/tensor_parallel.h).
std::unique_ptr<Transformer> load_engine_model(const EngineConfig& config,
                                               const TransformerOptions& opts, sync::TpGroup* tp);

// KV blocks of the pool: EngineConfig::num_kv_blocks, else what kv_memory_bytes holds (the same on
// every rank of a tensor-parallel group: their shards are alike).
int32_t engine_kv_blocks(const EngineConfig& config, const ModelConfig& mc, at::ScalarType dtype);

// After every rank of a tensor-parallel group built its shard and KV pool (or failed to: `failed`,
// or no `runner`), the group agrees on it before any step: a rank that failed (a bad checkpoint, a
// model that does not split, memory) ends the others at once instead of at their first
// collective's deadline, and the pools must match (the leader's block tables index every rank's).
// Rethrows this rank's failure; throws naming the ranks that failed or the first mismatch.
void agree_on_group(sync::TpGroup& tp, const std::exception_ptr& failed, const ModelRunner* runner,
                    const std::string& model_dir);

// An engine's in-process tensor-parallel group: rank 0's TpGroup, and a thread per other rank that
// joins the group on its device (CUDA: config.device's index + r) and runs LlmEngine::follow.
class LocalTpFollowers {
 public:
  // Refuses, before any thread starts, what the ranks would refuse later (the settings, a model
  // whose heads do not split, too few GPUs); names a CUDA device without an index in `config`.
  static std::unique_ptr<LocalTpFollowers> start(EngineConfig& config);
  // Ends the followers still waiting for a command and joins their threads (the engine stops them
  // first, through its ModelRunner).
  ~LocalTpFollowers();
  LocalTpFollowers(const LocalTpFollowers&) = delete;
  LocalTpFollowers& operator=(const LocalTpFollowers&) = delete;

  sync::TpGroup& group() { return *group_; }  // rank 0's
  TpLaneBoard& lanes() { return *lanes_; }    // every rank's weight buckets, with sync lanes

 private:
  LocalTpFollowers() = default;
  std::unique_ptr<sync::LocalTpHub> hub_;
  std::unique_ptr<TpLaneBoard> lanes_;
  std::unique_ptr<sync::TpGroup> group_;
  std::vector<std::thread> threads_;
};

}  // namespace crl::engine

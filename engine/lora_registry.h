// LoraRegistry: the engine's LoRA adapters (EngineConfig::max_loras slots of LoraSlots): which
// slot serves which adapter by name, each load's uid (it salts the prefix cache, so K/V of one
// load is never reused under another), and, for RL with LoRA, the policy adapter whose versions
// rotate through reserved slots as weight updates arrive.
//
// The registry knows slots, not requests: LlmEngine binds each request to a slot (bind()) and,
// when the policy moves to another slot, moves the requests it names.
//
// Thread safety: names(), check_known() and bind() may be called from any thread (requests are
// validated on the callers' threads); everything else belongs to the engine thread (or runs
// before an EngineLoop starts stepping the engine).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model/lora.h"
#include "engine/weight_buffers.h"

namespace crl::engine {

class LoraRegistry {
 public:
  // `slots`: null for an engine without LoRA (every add is refused naming --max-loras).
  // `dtype`, `device`: the model's, for the policy's receive buffers.
  LoraRegistry(std::unique_ptr<LoraSlots> slots, const ModelConfig& config, at::ScalarType dtype,
               at::Device device);
  LoraRegistry(const LoraRegistry&) = delete;
  LoraRegistry& operator=(const LoraRegistry&) = delete;

  // The slots the model and the runner read (null without LoRA).
  const LoraSlots* slots() const { return slots_.get(); }

  // Serves `adapter` under `name` from a free slot, unmerged. Throws std::invalid_argument when no
  // slot is free, the name is taken or empty, or the adapter does not fit the model or the slots
  // (naming the tensor or flag).
  void add(const std::string& name, const LoraAdapter& adapter);
  // add() of a PEFT adapter directory (adapter_config.json + adapter_model.safetensors).
  void load(const std::string& name, const std::string& dir);
  // The adapters' names, in slot order (the policy's older versions are hidden). Any thread.
  std::vector<std::string> names() const;
  // Throws std::invalid_argument unless an adapter is served under `name`, listing those that are.
  // Any thread.
  void check_known(const std::string& name) const;

  // A request's slot and the load it runs on; slot -1: the base model.
  struct Binding {
    int32_t slot = -1;
    uint64_t uid = 0;
    bool policy = false;  // the policy adapter's latest version (see attach_policy)
  };
  // The binding of a request naming adapter `name`; with no name, the policy's latest version when
  // there is a policy, else the base model. Any thread.
  Binding bind(const std::string& name) const;

  // RL with LoRA (issue 29): serves `initial` as adapter `name` and makes it the policy: requests
  // that name no adapter run on it, and weight updates are its new versions, received into the
  // returned buffers (whose layout the trainer sends) and loaded into a slot by load_policy().
  // `versions` slots hold the policy's latest versions (at most max_loras; hidden from names()):
  // under InflightPolicy::kKeep a request stays on the version it was admitted under, and an
  // update takes a slot no unfinished request uses. When every other slot is in use the oldest
  // one is reused and its requests go on under the new version with their K/V, as whole-model
  // updates do (counted in slot_reuses()). With one version the slot is updated in place.
  // `version`: the engine's weight version now. Once.
  LoraBuffers& attach_policy(const std::string& name, const LoraAdapter& initial,
                             int64_t bucket_bytes, int32_t versions, int64_t version);
  // The policy's receive buffers (null without a policy).
  LoraBuffers* policy_buffers() { return policy_buffers_.get(); }
  bool has_policy() const { return policy_buffers_ != nullptr; }
  // Loads what the policy buffers received into a policy slot, which becomes the policy's: a slot
  // no unfinished request uses (`in_use`: slot -> unfinished requests), the oldest version first;
  // else the oldest other one. Returns the new version's binding.
  Binding load_policy(const std::unordered_map<int32_t, int64_t>& in_use);
  // The policy's slot holds version `v` now; returns its binding. REQUIRES: has_policy().
  Binding set_policy_version(int64_t v);
  // Updates that had to reuse a slot unfinished requests were using.
  int64_t slot_reuses() const { return slot_reuses_; }

 private:
  struct Entry {
    std::string name;  // empty: a free slot (or an older policy version's)
    uint64_t uid = 0;
    bool reserved = false;  // loading, or holding an older policy version
  };

  const ModelConfig config_;
  const at::ScalarType dtype_;
  const at::Device device_;
  std::unique_ptr<LoraSlots> slots_;
  mutable std::mutex mu_;       // guards entries_, next_uid_ and policy_slot_
  std::vector<Entry> entries_;  // by slot
  uint64_t next_uid_ = 1;
  int32_t policy_slot_ = -1;  // the policy's latest version
  std::unique_ptr<LoraBuffers> policy_buffers_;
  std::vector<int32_t> policy_slots_;  // the slots holding the policy's versions
  std::vector<int64_t> slot_version_;  // per slot: the weight version a policy slot holds
  std::string policy_name_;
  int64_t slot_reuses_ = 0;
};

}  // namespace crl::engine

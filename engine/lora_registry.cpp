#include "engine/lora_registry.h"

#include <stdexcept>

#include "common/check.h"

namespace crl::engine {

LoraRegistry::LoraRegistry(std::unique_ptr<LoraSlots> slots, const ModelConfig& config,
                           at::ScalarType dtype, at::Device device)
    : config_(config), dtype_(dtype), device_(device), slots_(std::move(slots)) {
  if (slots_) entries_.resize(static_cast<size_t>(slots_->num_slots()));
}

void LoraRegistry::add(const std::string& name, const LoraAdapter& adapter) {
  if (name.empty()) throw std::invalid_argument("a LoRA adapter needs a name");
  if (!slots_) {
    throw std::invalid_argument("LoRA adapter '" + name +
                                "': the engine has no LoRA slots (--max-loras)");
  }
  size_t slot = entries_.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].name == name)
        throw std::invalid_argument("LoRA adapter '" + name + "' is already loaded");
      if (entries_[i].name.empty() && !entries_[i].reserved && slot == entries_.size()) slot = i;
    }
    if (slot == entries_.size()) {
      throw std::invalid_argument("LoRA adapter '" + name + "': all " +
                                  std::to_string(entries_.size()) +
                                  " LoRA slots are in use (--max-loras)");
    }
    entries_[slot].reserved = true;  // no other add takes it while it loads
  }
  try {
    slots_->load(static_cast<int64_t>(slot), adapter);  // throws for a misfit
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[slot].reserved = false;
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  entries_[slot] = Entry{name, next_uid_++, false};
}

void LoraRegistry::load(const std::string& name, const std::string& dir) {
  add(name, load_peft_adapter(dir, config_));
}

std::vector<std::string> LoraRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& e : entries_) {
    if (!e.name.empty()) names.push_back(e.name);
  }
  return names;
}

void LoraRegistry::check_known(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  bool found = false;
  std::string loaded;
  for (const auto& e : entries_) {
    found |= e.name == name;
    if (!e.name.empty()) loaded += (loaded.empty() ? "" : ", ") + e.name;
  }
  if (!found) {
    throw std::invalid_argument("unknown LoRA adapter '" + name +
                                "' (loaded: " + (loaded.empty() ? "none" : loaded) + ")");
  }
}

LoraRegistry::Binding LoraRegistry::bind(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  Binding b;
  if (name.empty()) {
    if (policy_slot_ >= 0)
      b = {policy_slot_, entries_[static_cast<size_t>(policy_slot_)].uid, true};
    return b;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].name == name) b = {static_cast<int32_t>(i), entries_[i].uid, false};
  }
  return b;
}

LoraBuffers& LoraRegistry::attach_policy(const std::string& name, const LoraAdapter& initial,
                                         int64_t bucket_bytes, int32_t versions, int64_t version) {
  CRL_CHECK(!policy_buffers_, "attach_policy: the engine already has a policy adapter");
  CRL_CHECK(versions >= 1 && slots_ && versions <= slots_->num_slots(), "attach_policy: ", versions,
            " policy versions need as many LoRA slots (--max-loras), the engine has ",
            slots_ ? slots_->num_slots() : 0);
  // The slot takes the buffers' contents (the adapter in the compute dtype, as every later update
  // arrives), not `initial` itself: an fp32 adapter from a checkpoint scales as the trainer does.
  auto buffers = std::make_unique<LoraBuffers>(initial, dtype_, device_, bucket_bytes);
  add(name, buffers->adapter());
  policy_buffers_ = std::move(buffers);
  std::lock_guard<std::mutex> lock(mu_);
  slot_version_.assign(entries_.size(), -1);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].name == name) policy_slot_ = static_cast<int32_t>(i);
  }
  policy_name_ = name;
  policy_slots_.push_back(policy_slot_);
  slot_version_[static_cast<size_t>(policy_slot_)] = version;
  // The older versions' slots: reserved (add cannot take them), nameless (not addressable).
  for (size_t i = 0; i < entries_.size() && static_cast<int32_t>(policy_slots_.size()) < versions;
       ++i) {
    if (entries_[i].name.empty() && !entries_[i].reserved) {
      entries_[i].reserved = true;
      policy_slots_.push_back(static_cast<int32_t>(i));
    }
  }
  CRL_CHECK(static_cast<int32_t>(policy_slots_.size()) == versions, "attach_policy: ", versions,
            " policy versions, but only ", policy_slots_.size(),
            " LoRA slots are free (--max-loras)");
  return *policy_buffers_;
}

LoraRegistry::Binding LoraRegistry::load_policy(
    const std::unordered_map<int32_t, int64_t>& in_use) {
  CRL_CHECK(policy_buffers_ && policy_slot_ >= 0, "load_policy: no policy adapter (attach_policy)");
  // A slot no unfinished request uses, the oldest version first; else the oldest other one (its
  // requests go on under the new version); with one version, the policy's own slot.
  int32_t target = -1, oldest = -1;
  for (int32_t s : policy_slots_) {
    if (s == policy_slot_ && policy_slots_.size() > 1) continue;
    const int64_t v = slot_version_[static_cast<size_t>(s)];
    if (oldest < 0 || v < slot_version_[static_cast<size_t>(oldest)]) oldest = s;
    if (in_use.count(s) == 0 && (target < 0 || v < slot_version_[static_cast<size_t>(target)]))
      target = s;
  }
  if (target < 0) {
    target = oldest;
    if (policy_slots_.size() > 1) ++slot_reuses_;
  }
  slots_->load(target, policy_buffers_->adapter());
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t uid = next_uid_++;  // this version's K/V is its own in the prefix cache
  if (target != policy_slot_) {
    entries_[static_cast<size_t>(policy_slot_)].name.clear();
    entries_[static_cast<size_t>(policy_slot_)].reserved = true;
  }
  entries_[static_cast<size_t>(target)] = Entry{policy_name_, uid, false};
  policy_slot_ = target;
  return {target, uid, true};
}

LoraRegistry::Binding LoraRegistry::set_policy_version(int64_t v) {
  std::lock_guard<std::mutex> lock(mu_);
  CRL_CHECK(policy_slot_ >= 0, "set_policy_version: no policy adapter");
  slot_version_[static_cast<size_t>(policy_slot_)] = v;
  return {policy_slot_, entries_[static_cast<size_t>(policy_slot_)].uid, true};
}

}  // namespace crl::engine

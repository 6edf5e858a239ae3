#include "trainer/rollout_batcher.h"

#include <utility>

namespace crl::trainer {

RolloutBatcher::RolloutBatcher(int64_t oldest_allowed, int64_t micro_batch_tokens, Send send,
                               EndStep end_step)
    : oldest_allowed_(oldest_allowed),
      micro_batch_tokens_(micro_batch_tokens),
      send_(std::move(send)),
      end_step_(std::move(end_step)) {}

bool RolloutBatcher::too_old(const SampleGroup& group) const {
  for (const Sample& s : group.samples) {
    for (size_t j = 0; j < s.versions.size(); ++j) {
      const bool trains = s.loss_mask.empty() || s.loss_mask[j] != 0;
      if (trains && s.versions[j] < oldest_allowed_) return true;
    }
  }
  return false;
}

bool RolloutBatcher::add(SampleGroup group, Advantages advantages) {
  if (too_old(group)) {
    ++dropped_;
    if (observe_) observe_(group, true);
    return false;
  }
  if (group.samples.empty()) return true;
  for (const Sample& s : group.samples) {
    const size_t prompt = s.prompt_ids.empty() ? group.prompt_ids.size() : s.prompt_ids.size();
    pending_tokens_ += static_cast<int64_t>(prompt + s.completion_ids.size());
  }
  if (advantages == Advantages::kGroup) compute_group_advantages(group);
  ++kept_;
  bool signal = false;
  for (const Sample& s : group.samples) signal = signal || s.advantage != 0;
  without_signal_ += !signal;
  if (observe_) observe_(group, false);
  pending_.push_back(std::move(group));
  if (pending_tokens_ >= micro_batch_tokens_) {
    sent_bytes_ += send_(pending_);
    pending_tokens_ = 0;
  }
  return true;
}

int64_t RolloutBatcher::finish() {
  sent_bytes_ += send_(pending_);
  pending_tokens_ = 0;
  end_step_();
  return sent_bytes_;
}

}  // namespace crl::trainer

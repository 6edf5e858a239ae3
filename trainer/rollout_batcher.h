// RolloutBatcher: one GRPO step's finished groups on their way to the train ranks, the same for
// single-turn rollouts and multi-turn episodes. A group is dropped (counted, never trained on)
// when a token it trains on was sampled by weights older than the step allows
// (VersionPlan::oldest_allowed); else it is queued with its advantages, and the queue is packed
// and sent whenever it holds micro_batch_tokens. finish() sends the rest and ends the step.
//
// Thread safety: none; the producer's thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "trainer/micro_batch.h"

namespace crl::trainer {

class RolloutBatcher {
 public:
  // Packs and queues the groups for the train ranks, clears them, returns the bytes queued.
  using Send = std::function<int64_t(std::vector<SampleGroup>&)>;
  // Ends the step for the train ranks (after its last micro-batch).
  using EndStep = std::function<void()>;

  RolloutBatcher(int64_t oldest_allowed, int64_t micro_batch_tokens, Send send, EndStep end_step);

  enum class Advantages {
    kGroup,    // GRPO over the group's rewards (compute_group_advantages)
    kAsGiven,  // the samples carry theirs (multi-turn: each episode's, group_episode_samples)
  };
  // A finished group: its samples with the version of each token (Sample::versions) and the loss
  // mask (Sample::loss_mask; empty: every token trains). Returns false when it was dropped as too
  // old. A group without samples is ignored.
  bool add(SampleGroup group, Advantages advantages);
  // Sends what is queued and ends the step; returns the bytes the step sent.
  int64_t finish();

  int64_t groups_dropped() const { return dropped_; }
  // Groups queued (not dropped, with samples), and of them those whose advantages are all 0:
  // every sample scored the same, so GRPO learns nothing from them (TRL's frac_reward_zero_std).
  int64_t groups_kept() const { return kept_; }
  int64_t groups_without_signal() const { return without_signal_; }

  // Sees every finished group once: after its advantages, or (dropped = true) when dropped as
  // too old (its advantages then unset). --traces writes them.
  using Observe = std::function<void(const SampleGroup&, bool dropped)>;
  void set_observer(Observe observe) { observe_ = std::move(observe); }

 private:
  bool too_old(const SampleGroup& group) const;

  const int64_t oldest_allowed_;
  const int64_t micro_batch_tokens_;
  Send send_;
  EndStep end_step_;
  Observe observe_;
  std::vector<SampleGroup> pending_;
  int64_t pending_tokens_ = 0;
  int64_t sent_bytes_ = 0;
  int64_t dropped_ = 0;
  int64_t kept_ = 0;
  int64_t without_signal_ = 0;
};

}  // namespace crl::trainer

// Learning-rate schedule: linear warmup, then cosine decay to a floor (pure functions).
#pragma once

#include <cstdint>

namespace crl::trainer {

struct LrSchedule {
  // Peak learning rate, reached at the end of warmup.
  double lr = 1e-4;
  // Optimizer steps of linear warmup from lr / warmup_steps up to lr (0 = none).
  int64_t warmup_steps = 0;
  // Step at which the cosine reaches min_lr; 0 = constant lr after warmup.
  int64_t total_steps = 0;
  // Floor of the cosine decay.
  double min_lr = 0.0;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

// Learning rate of optimizer step `step` (0-based): (step + 1) / warmup_steps * lr during warmup,
// then min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 with progress = (step - warmup) /
// (total - warmup) capped at 1.
double lr_at(const LrSchedule& schedule, int64_t step);

}  // namespace crl::trainer

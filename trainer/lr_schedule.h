// Learning-rate schedule: linear warmup, then cosine decay to a floor (pure functions).
#pragma once

#include <cstdint>

namespace crl::trainer {

struct LrSchedule {
  // Peak learning rate, reached at the end of warmup.
  double lr = 1e-4;
  // Optimizer steps of linear warmup from lr / warmup_steps up to lr (0 = none; at most
  // total_steps when that is set, so a short run still reaches lr).
  int64_t warmup_steps = 0;
  // Step at which the cosine reaches min_lr (the step after a run of total_steps steps, whose
  // last step is just above it); 0 = constant lr after warmup.
  int64_t total_steps = 0;
  // Floor of the cosine decay.
  double min_lr = 0.0;

  // Throws std::invalid_argument naming the field and value.
  void validate() const;
};

// Learning rate of optimizer step `step` (0-based): (step + 1) / warmup * lr during warmup (warmup
// = warmup_steps, capped at total_steps when set), then min_lr + (lr - min_lr) * (1 + cos(pi *
// progress)) / 2 with progress = (step - warmup) / (total - warmup) capped at 1.
double lr_at(const LrSchedule& schedule, int64_t step);

}  // namespace crl::trainer

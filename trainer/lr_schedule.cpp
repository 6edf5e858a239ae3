#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/check.h"

namespace crl::trainer {

void LrSchedule::validate() const {
  if (!(lr >= 0)) CRL_INVALID("invalid learning-rate setting 'lr': ", lr, " (must be >= 0)");
  if (warmup_steps < 0)
    CRL_INVALID("invalid learning-rate setting 'warmup_steps': ", warmup_steps, " (must be >= 0)");
  if (total_steps < 0)
    CRL_INVALID("invalid learning-rate setting 'total_steps': ", total_steps, " (must be >= 0)");
  if (!(min_lr >= 0 && min_lr <= lr)) {
    CRL_INVALID("invalid learning-rate setting 'min_lr': ", min_lr, " (must be in [0, lr])");
  }
}

double lr_at(const LrSchedule& s, int64_t step) {
  // A run shorter than its warmup still reaches the peak at its last step.
  const int64_t warmup =
      s.total_steps > 0 ? std::min(s.warmup_steps, s.total_steps) : s.warmup_steps;
  if (step < warmup) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  if (s.total_steps <= warmup) return s.lr;
  const double progress = std::min(
      1.0, static_cast<double>(step - warmup) / static_cast<double>(s.total_steps - warmup));
  return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace crl::trainer

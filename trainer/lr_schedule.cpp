#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/check.h"

namespace crl::trainer {

void LrSchedule::validate() const {
  if (!(lr >= 0)) CRL_INVALID("invalid learning-rate setting 'lr': ", lr, " (must be >= 0)");
  if (warmup_steps < 0) CRL_INVALID("invalid learning-rate setting 'warmup_steps': ", warmup_steps, " (must be >= 0)");
  if (total_steps < 0) CRL_INVALID("invalid learning-rate setting 'total_steps': ", total_steps, " (must be >= 0)");
  if (!(min_lr >= 0 && min_lr <= lr)) {
    CRL_INVALID("invalid learning-rate setting 'min_lr': ", min_lr, " (must be in [0, lr])");
  }
}

double lr_at(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (s.total_steps <= s.warmup_steps) return s.lr;
  const double progress = std::min(
      1.0, static_cast<double>(step - s.warmup_steps) /
               static_cast<double>(s.total_steps - s.warmup_steps));
  return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace crl::trainer

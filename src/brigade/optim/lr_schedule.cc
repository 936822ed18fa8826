#include "brigade/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace brigade {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;
  const double span = static_cast<double>(total_steps - warmup_steps);
  const double progress = span <= 0 ? 1.0 : static_cast<double>(step - warmup_steps) / span;
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace brigade

// Learning rate: linear warmup, then cosine decay to min_lr.
//   step < warmup:         lr * (step + 1) / warmup
//   warmup <= step < total: min_lr + (lr - min_lr) * 0.5 (1 + cos(pi * progress))
//   step >= total:          min_lr
// `step` is 0-based. A pure function of the step, so resume needs no state.
#pragma once

#include <cstdint>

namespace brigade {

struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double at(int64_t step) const;
};

}  // namespace brigade

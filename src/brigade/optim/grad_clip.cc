#include "brigade/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "brigade/kernels/cpu/vector_ops.h"

namespace brigade {

double grad_norm(const float* grads, int64_t n) {
  return std::sqrt(cpu::sum_squares(grads, n));
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace brigade

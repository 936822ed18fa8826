#include "brigade/optim/grad_clip.h"

#include <cmath>

#include "brigade/kernels/cpu/vector_ops.h"

namespace brigade {

double grad_norm(const float* grads, int64_t n) {
  return std::sqrt(cpu::sum_squares(grads, n));
}

double clip_grad_norm(float* grads, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double scale = max_norm / (norm + 1e-6);
  if (scale >= 1.0) return 1.0;
  cpu::scale_inplace(grads, static_cast<float>(scale), n);
  return scale;
}

}  // namespace brigade

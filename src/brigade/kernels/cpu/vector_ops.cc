#include "brigade/kernels/cpu/vector_ops.h"

#include <cmath>

#include "brigade/kernels/cpu/parallel.h"

namespace brigade::cpu {

double sum_squares(const float* x, int64_t n) {
  double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (worth_threading(n))
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWStep& s) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), s.step));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), s.step));
  const float step_size = s.lr / bias1;
  const float bias2_sqrt = std::sqrt(bias2);
  const float decay = 1.0f - s.lr * s.weight_decay;
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bias2_sqrt + s.eps;
    params[i] = params[i] * decay - step_size * mi / denom;
  }
}

}  // namespace brigade::cpu

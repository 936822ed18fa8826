#include "brigade/kernels/cpu/gelu.h"

#include "brigade/kernels/cpu/fast_exp.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

BRIGADE_ISA_NAMESPACE(brigade::cpu) {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// tanh(u) = 1 - 2 / (exp(2u) + 1) through fast_exp, so the loops vectorise;
// right at both tails (exp -> inf gives 1, exp -> 0 gives -1).
inline float fast_tanh(float u) {
  return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f);
}

// gelu'(v) = 0.5 (1 + t) + 0.5 v (1 - t^2) du/dv, for t = tanh(u),
// u = sqrt(2/pi) (v + 0.044715 v^3); `t` is returned for the activation.
inline float gelu_grad(float v, float& t) {
  const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
  t = fast_tanh(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}
}  // namespace

void gelu_forward(float* out, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    out[i] = 0.5f * v * (1.0f + fast_tanh(u));
  }
}

void gelu_backward(float* dx, const float* dout, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
  for (int64_t i = 0; i < n; ++i) {
    float t;
    dx[i] = dout[i] * gelu_grad(x[i], t);
  }
}

void gelu_forward_backward(float* out, float* dx, const float* dout, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    float t;
    const float grad = gelu_grad(v, t);
    out[i] = 0.5f * v * (1.0f + t);
    dx[i] = dout[i] * grad;
  }
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

// Elementwise operations over flat float arrays, threaded.
#pragma once

#include <cstdint>

namespace brigade::cpu {

// sum_i x[i]^2, accumulated in double: gradients of 10^8 elements would lose
// digits in a float sum.
double sum_squares(const float* x, int64_t n);

// AdamW on one contiguous range (Loshchilov & Hutter, decoupled decay),
// with g = grads * grad_scale:
//   p -= lr * wd * p
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
// The arithmetic order follows torch.optim.AdamW so the two agree to rounding.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
  float grad_scale = 1.0f;
};
// Where the updated values also go, element for element (each may be
// null): an in-memory snapshot's file, written by the update that computes
// them instead of by a copy that reads them again (optim/adamw.h). Streaming
// stores, fenced before the call returns.
struct AdamWCopy {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWStep& s, const AdamWCopy& copy);

}  // namespace brigade::cpu

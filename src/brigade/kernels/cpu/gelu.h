// GELU, tanh approximation (GPT-2's):
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
#pragma once

#include <cstdint>

namespace brigade::cpu {

// out[i] = gelu(x[i]) for i < n. out may alias x.
void gelu_forward(float* out, const float* x, int64_t n);

// dx[i] = dout[i] * gelu'(x[i]). dx may alias dout (in-place).
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n);

}  // namespace brigade::cpu

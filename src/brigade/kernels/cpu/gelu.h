// GELU, tanh approximation (GPT-2's):
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
#pragma once

#include <cstdint>

namespace brigade::cpu {

// out[i] = gelu(x[i]) for i < n. out may alias x.
void gelu_forward(float* out, const float* x, int64_t n);

// dx[i] = dout[i] * gelu'(x[i]). dx may alias dout (in-place).
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n);

// Both at once, from one tanh per element: out[i] = gelu(x[i]) and
// dx[i] = dout[i] * gelu'(x[i]). The backward pass recomputes the MLP's
// activation (cheaper than storing it) for its weight gradient and needs
// gelu' in the same place: one pass over x instead of two. dx may alias
// dout; out must not alias x, dout or dx.
void gelu_forward_backward(float* out, float* dx, const float* dout, const float* x, int64_t n);

}  // namespace brigade::cpu

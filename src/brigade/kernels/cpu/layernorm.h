// LayerNorm over the last dimension (GPT-2: eps = 1e-5), with weight and bias.
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps)
// mean and rstd are saved per row for the backward pass.
#pragma once

#include <cstdint>

namespace brigade::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out (N,C), mean (N), rstd (N) from x (N,C), w (C), b (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c);

// The residual add fused with the LayerNorm that follows it:
//   sum (N,C) = a + delta;  out = LayerNorm(sum).
// One pass over memory instead of two; `sum` is the new residual stream.
void residual_layernorm_forward(float* sum, float* out, float* mean, float* rstd, const float* a,
                                const float* delta, const float* w, const float* b, int64_t n,
                                int64_t c);

// Inverts layernorm_forward, given dout (N,C):
//   dx (N,C) += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w, xhat = (x-mean)*rstd
//   dw (C) += sum_rows dout * xhat;  db (C) += sum_rows dout
// dx accumulates because in a pre-LN block x is the residual stream, whose
// gradient already holds the skip connection's contribution.
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* mean, const float* rstd, const float* w, int64_t n, int64_t c);

}  // namespace brigade::cpu

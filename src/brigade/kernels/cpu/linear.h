// Dense layers through cpu::gemm. Weights are stored (in, out), the layout of
// Hugging Face's GPT-2 Conv1D, so y = x W is a plain row-major GEMM and
// neither direction needs a transposed copy.
#pragma once

#include <cstdint>

namespace brigade::cpu {

// out (N,O) = in (N,I) @ w (I,O) + bias (O).  bias may be null.
void linear_forward(float* out, const float* in, const float* w, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features);

// Inverts linear_forward, given dout (N,O):
//   din  (N,I) = dout @ w^T        (overwritten if accumulate_din is false, else added)
//   dw   (I,O) += in^T @ dout
//   dbias  (O) += sum over rows of dout   (skipped if dbias is null)
void linear_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                     const float* w, int64_t n, int64_t in_features, int64_t out_features,
                     bool accumulate_din);

// acc (O) += sum over the N rows of x (N,O).
void add_column_sums(float* acc, const float* x, int64_t n, int64_t cols);

}  // namespace brigade::cpu

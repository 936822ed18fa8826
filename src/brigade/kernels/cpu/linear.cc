#include "brigade/kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

void linear_forward(float* out, const float* in, const float* w, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features) {
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed every row with the bias and let the GEMM accumulate onto it:
    // one pass over `out` instead of a GEMM followed by a bias pass.
#pragma omp parallel for schedule(static) if (worth_threading(n * out_features))
    for (int64_t row = 0; row < n; ++row) {
      std::memcpy(out + row * out_features, bias, sizeof(float) * out_features);
    }
    beta = 1.0f;
  }
  gemm(false, false, n, out_features, in_features, 1.0f, in, in_features, w, out_features, beta,
       out, out_features);
}

void add_column_sums(float* acc, const float* x, int64_t n, int64_t cols) {
  // Each thread owns a range of columns, so no two threads write the same
  // acc[j]; the inner loop runs along a row and vectorises.
  constexpr int64_t kColumnBlock = 64;
  const int64_t num_blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (worth_threading(n * cols))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = std::min(cols, c0 + kColumnBlock);
    float partial[kColumnBlock] = {};
    for (int64_t row = 0; row < n; ++row) {
      const float* xr = x + row * cols;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) partial[c - c0] += xr[c];
    }
    for (int64_t c = c0; c < c1; ++c) acc[c] += partial[c - c0];
  }
}

void linear_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                     const float* w, int64_t n, int64_t in_features, int64_t out_features,
                     bool accumulate_din) {
  if (din != nullptr) {
    // din (N,I) = dout (N,O) @ w^T (O,I)
    gemm(false, true, n, in_features, out_features, 1.0f, dout, out_features, w, out_features,
         accumulate_din ? 1.0f : 0.0f, din, in_features);
  }
  // dw (I,O) += in^T (I,N) @ dout (N,O)
  gemm(true, false, in_features, out_features, n, 1.0f, in, in_features, dout, out_features, 1.0f,
       dw, out_features);
  if (dbias != nullptr) add_column_sums(dbias, dout, n, out_features);
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

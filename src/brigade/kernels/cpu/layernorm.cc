#include "brigade/kernels/cpu/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

BRIGADE_ISA_NAMESPACE(brigade::cpu) {
namespace {

inline void normalize_row(float* out, float* mean_out, float* rstd_out, const float* x,
                          const float* w, const float* b, int64_t c) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < c; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(c);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < c; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(c) + kLayerNormEps);
#pragma omp simd
  for (int64_t i = 0; i < c; ++i) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(n * c))
  for (int64_t row = 0; row < n; ++row) {
    normalize_row(out + row * c, mean + row, rstd + row, x + row * c, w, b, c);
  }
}

void residual_layernorm_forward(float* sum, float* out, float* mean, float* rstd, const float* a,
                                const float* delta, const float* w, const float* b, int64_t n,
                                int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(n * c))
  for (int64_t row = 0; row < n; ++row) {
    float* s = sum + row * c;
    const float* ar = a + row * c;
    const float* dr = delta + row * c;
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) s[i] = ar[i] + dr[i];
    normalize_row(out + row * c, mean + row, rstd + row, s, w, b, c);
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* mean, const float* rstd, const float* w, int64_t n,
                        int64_t c) {
  // dw and db are sums over rows: each thread sums its rows into a private
  // copy, then the copies are added once, so rows can be split freely.
  const int num_threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(num_threads) * 2 * c, 0.0f);
#pragma omp parallel if (worth_threading(n * c))
  {
    float* pdw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * c;
    float* pdb = pdw + c;
#pragma omp for schedule(static)
    for (int64_t row = 0; row < n; ++row) {
      const float* xr = x + row * c;
      const float* gr = dout + row * c;
      float* dxr = dx + row * c;
      const float mu = mean[row], rs = rstd[row];
      float mean_g = 0.0f, mean_gx = 0.0f;
#pragma omp simd reduction(+ : mean_g, mean_gx)
      for (int64_t i = 0; i < c; ++i) {
        const float xhat = (xr[i] - mu) * rs;
        const float g = gr[i] * w[i];
        mean_g += g;
        mean_gx += g * xhat;
      }
      mean_g /= static_cast<float>(c);
      mean_gx /= static_cast<float>(c);
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) {
        const float xhat = (xr[i] - mu) * rs;
        const float g = gr[i] * w[i];
        dxr[i] += rs * (g - mean_g - xhat * mean_gx);
        pdw[i] += gr[i] * xhat;
        pdb[i] += gr[i];
      }
    }
  }
  for (int t = 0; t < num_threads; ++t) {
    const float* pdw = partial.data() + static_cast<size_t>(t) * 2 * c;
    const float* pdb = pdw + c;
    for (int64_t i = 0; i < c; ++i) {
      dw[i] += pdw[i];
      db[i] += pdb[i];
    }
  }
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

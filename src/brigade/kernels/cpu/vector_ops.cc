#include "brigade/kernels/cpu/vector_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/core/stream_store.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

double sum_squares(const float* x, int64_t n) {
  // Fixed blocks summed in a fixed order, not an OpenMP reduction (which
  // combines per-thread sums in whatever order threads finish): the gradient
  // norm, and so the clipping factor, must not change from run to run, or
  // resume would not be bit-identical.
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(num_blocks), 0.0);
#pragma omp parallel for schedule(static) if (worth_threading(n))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t end = std::min(n, (blk + 1) * kBlock);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = blk * kBlock; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[blk] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWStep& s, const AdamWCopy& copy) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), s.step));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), s.step));
  const float step_size = s.lr / bias1;
  const float bias2_sqrt = std::sqrt(bias2);
  const float decay = 1.0f - s.lr * s.weight_decay;
  // Blocks of 2048 elements (8 KB of each array): a block's new values are
  // copied out while they are still in L1. One loop body whether or not a
  // copy is asked for, so the two round identically.
  constexpr int64_t kBlock = 2048;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  const bool copying = copy.params != nullptr || copy.m != nullptr || copy.v != nullptr;
#pragma omp parallel if (worth_threading(n))
  {
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      const int64_t begin = blk * kBlock;
      const int64_t end = std::min(n, begin + kBlock);
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) {
        const float g = grads[i] * s.grad_scale;
        const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
        const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = std::sqrt(vi) / bias2_sqrt + s.eps;
        params[i] = params[i] * decay - step_size * mi / denom;
      }
      if (copying) {
        const auto bytes = static_cast<size_t>(end - begin) * sizeof(float);
        if (copy.params) copy_nontemporal(copy.params + begin, params + begin, bytes);
        if (copy.m) copy_nontemporal(copy.m + begin, m + begin, bytes);
        if (copy.v) copy_nontemporal(copy.v + begin, v + begin, bytes);
      }
    }
    // Each thread's streaming stores, before the team joins.
    if (copying) store_fence();
  }
}

const char* kernels_compiled_for() {
#if defined(BRIGADE_KERNELS_AVX512)
  // An AVX-512 intrinsic compiles only where isa_variant.h's target pragma
  // is in force (GCC's C++ front end does not define __AVX512F__ for it).
  float in[16], out[16];
  for (int i = 0; i < 16; ++i) in[i] = static_cast<float>(i);
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(in), _mm512_loadu_ps(in)));
  return out[15] == 30.0f ? "avx512" : "not avx512";
#else
  return "avx2";
#endif
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

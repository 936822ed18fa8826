// Finite-difference gradient checking for the fp32 kernels.
//
// For a kernel y = f(x), pick a random projection R and the scalar
// L(x) = sum_i y_i R_i. The backward pass given dout = R must return dL/dx;
// we compare it with the central difference (L(x + h e_j) - L(x - h e_j)) / 2h
// on a sample of coordinates j, accumulated in double. fp32 rounding limits
// agreement to about 1e-3 of the gradient's scale, while a wrong backward is
// off by O(1) of it, so the tolerance separates the two cleanly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "brigade/core/philox.h"

namespace brigade::testing {

inline std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = Philox::normal2(seed, 0, i)[0] * scale;
  }
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks `analytic` (the kernel's dL/dx) against central differences of
// `loss` (which reads x) at up to `samples` coordinates of x.
inline void expect_gradient_matches(const char* what, std::vector<float>& x,
                                    const std::vector<float>& analytic,
                                    const std::function<double()>& loss, float h = 1e-2f,
                                    size_t samples = 64, double rtol = 2e-2) {
  ASSERT_EQ(x.size(), analytic.size());
  double scale = 0;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  ASSERT_GT(scale, 0.0) << what << ": the analytic gradient is all zeros";
  const size_t stride = std::max<size_t>(1, x.size() / samples);
  double worst = 0;
  size_t worst_index = 0;
  double worst_numeric = 0;
  for (size_t j = 0; j < x.size(); j += stride) {
    const float saved = x[j];
    x[j] = saved + h;
    const double plus = loss();
    x[j] = saved - h;
    const double minus = loss();
    x[j] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    const double err = std::fabs(numeric - analytic[j]);
    if (err > worst) {
      worst = err;
      worst_index = j;
      worst_numeric = numeric;
    }
  }
  EXPECT_LE(worst, rtol * scale) << what << ": coordinate " << worst_index << " analytic "
                                 << analytic[worst_index] << " numeric " << worst_numeric
                                 << " (gradient scale " << scale << ")";
}

}  // namespace brigade::testing

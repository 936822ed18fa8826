#include "brigade/kernels/cpu/sgemm_peak.h"

#include <algorithm>

#include "brigade/core/aligned_buffer.h"
#include "brigade/core/clock.h"
#include "brigade/kernels/cpu/gemm.h"

namespace brigade::cpu {

double measure_sgemm_peak_gflops() {
  constexpr int kN = 1536;
  FloatBuffer a(kN * kN), b(kN * kN), c(kN * kN);
  for (int64_t i = 0; i < a.size(); ++i) {
    a.data()[i] = static_cast<float>(i % 7) * 0.1f;
    b.data()[i] = static_cast<float>(i % 5) * 0.1f;
  }
  double best_s = 1e30;
  for (int rep = 0; rep < 4; ++rep) {  // the first rep warms caches and threads
    Stopwatch sw;
    gemm(false, false, kN, kN, kN, 1.0f, a.data(), kN, b.data(), kN, 0.0f, c.data(), kN);
    if (rep > 0) best_s = std::min(best_s, sw.elapsed_s());
  }
  return 2.0 * kN * kN * static_cast<double>(kN) / best_s * 1e-9;
}

}  // namespace brigade::cpu

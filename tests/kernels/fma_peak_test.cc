// The FMA peak, MFU's denominator: a whole number of FMA units, the lanes
// CPUID promises, a plausible clock, the product of the three, and the sgemm
// figure in its place when the sgemm beat it.
#include "brigade/kernels/cpu/fma_peak.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "brigade/kernels/cpu/isa.h"

namespace brigade::cpu {
namespace BRIGADE_TEST_FILE {

void expect_consistent(const FmaPeak& p, int threads) {
  EXPECT_EQ(p.threads, threads);
  EXPECT_TRUE(p.fma_units == 1 || p.fma_units == 2) << p.fma_units;
  EXPECT_EQ(p.lanes, cpu_features().avx512 ? 16 : 8);
  EXPECT_GT(p.clock_ghz, 0.5);
  EXPECT_LT(p.clock_ghz, 7.0);
  EXPECT_NEAR(p.gflops, threads * p.fma_units * p.lanes * 2.0 * p.clock_ghz, 1e-9 * p.gflops);
}

TEST(FmaPeak, IsUnitsTimesLanesTimesTwoTimesClock) {
  const auto start = std::chrono::steady_clock::now();
  const FmaPeak one = measure_fma_peak(1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_consistent(one, 1);
  // ~40 ms of loops; a loaded machine stretches it, 2 s would be a hang.
  EXPECT_LT(seconds, 2.0);
  expect_consistent(measure_fma_peak(2), 2);
}

TEST(FmaPeak, MachinePeakPrefersAHigherSgemm) {
  const MachinePeak fma = machine_peak(1, 1.0);  // no sgemm is that slow
  EXPECT_EQ(fma.source, "fma");
  EXPECT_DOUBLE_EQ(fma.gflops, fma.fma.gflops);
  EXPECT_EQ(fma.description.rfind("FMA peak: 1 thread x ", 0), 0u) << fma.description;
  EXPECT_NE(fma.description.find(" GHz = "), std::string::npos) << fma.description;

  const MachinePeak sgemm = machine_peak(1, 1e9);  // a petaflop on one core
  EXPECT_EQ(sgemm.source, "sgemm");
  EXPECT_DOUBLE_EQ(sgemm.gflops, 1e9);
  EXPECT_DOUBLE_EQ(sgemm.sgemm_gflops, 1e9);
  EXPECT_LT(sgemm.fma.gflops, 1e9);
  EXPECT_NE(sgemm.description.find("sgemm"), std::string::npos) << sgemm.description;
  EXPECT_NE(sgemm.description.find("1 thread x "), std::string::npos) << sgemm.description;
}

TEST(FmaPeak, ChoosePeakTakesTheHigherFigure) {
  FmaPeak f;
  f.threads = 2;
  f.fma_units = 2;
  f.lanes = 16;
  f.clock_ghz = 2.9;
  f.gflops = 2 * 2 * 16 * 2 * 2.9;
  const MachinePeak low_sgemm = choose_peak(f, 100.0);
  EXPECT_EQ(low_sgemm.source, "fma");
  EXPECT_DOUBLE_EQ(low_sgemm.gflops, f.gflops);
  EXPECT_EQ(low_sgemm.description,
            "FMA peak: 2 threads x 2 FMA units x 16 fp32 lanes x 2 x 2.90 GHz = 371 GFLOP/s");
  const MachinePeak high_sgemm = choose_peak(f, 400.0);
  EXPECT_EQ(high_sgemm.source, "sgemm");
  EXPECT_DOUBLE_EQ(high_sgemm.gflops, 400.0);
  // The figure used follows the first " = " (what users and tests read).
  EXPECT_EQ(high_sgemm.description.rfind("measured sgemm peak = 400 GFLOP/s, above the FMA peak "
                                         "(2 threads x 2 FMA units x 16 fp32 lanes x 2 x 2.90 GHz",
                                         0),
            0u)
      << high_sgemm.description;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::cpu

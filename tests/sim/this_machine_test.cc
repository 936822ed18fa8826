// this-machine's hardware from a calibration file: a worker's share of the
// cores, the machine's peak, the measured GEMM curve and the all-reduce's
// bandwidth and latency.
#include "brigade/sim/this_machine.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "brigade/core/error.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

nlohmann::json calibration() {
  // 1 thread alone: 110 GFLOP/s; 2 threads together: 200 (so one of two
  // busy workers gets 100, not 110). Peaks (FMA): 160 alone, 300 together.
  return {{"cores", 2},
          {"memory_bytes", 16e9},
          {"cache_bytes", 32e6},
          {"compute",
           {{{"threads", 1},
             {"peak_gflops", 160.0},
             {"gemm", {{1e6, 55.0}, {1e8, 110.0}}},
             {"stream_bytes_per_s", 30e9},
             {"cache_stream_bytes_per_s", 90e9},
             {"adamw_params_per_s", 250e6},
             {"refault_bytes_per_s", 1e9},
             {"attention_gflops", 60.0},
             {"kernel_overhead_s", 2e-6}},
            {{"threads", 2},
             {"peak_gflops", 300.0},
             {"gemm", {{1e6, 100.0}, {1e8, 200.0}}},
             {"stream_bytes_per_s", 50e9},
             {"cache_stream_bytes_per_s", 200e9},
             {"adamw_params_per_s", 400e6},
             {"refault_bytes_per_s", 2e9},
             {"attention_gflops", 100.0},
             {"kernel_overhead_s", 3e-6}}}},
          {"comm",
           {{"nproc", 2},
            {"all_reduce",
             {{{"bytes", 4096}, {"time_s", 40e-6}},
              {{"bytes", 16384}, {"time_s", 9e-6}},
              {{"bytes", 16777216}, {"time_s", 8e-3}}}}}}};
}

TEST(ThisMachine, OneWorkerGetsEveryCore) {
  const Hardware h = this_machine_hardware(calibration(), 1);
  // The machine's peak (min(160 x 2, 300)); GEMMs at the measured 200 of it,
  // attention at its measured 100: step times follow the measured rates.
  EXPECT_DOUBLE_EQ(h.peak_flops, 300e9);
  EXPECT_DOUBLE_EQ(h.gemm_efficiency, 200.0 / 300.0);
  EXPECT_DOUBLE_EQ(h.memory_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(h.attention_efficiency, 100.0 / 300.0);
  EXPECT_DOUBLE_EQ(h.memory_bytes, 16e9);
  EXPECT_DOUBLE_EQ(h.cache_bytes, 32e6);
  EXPECT_DOUBLE_EQ(h.cache_bytes_per_s, 200e9);
  EXPECT_DOUBLE_EQ(h.optimizer_params_per_s, 400e6);
  EXPECT_EQ(h.gpus_per_node, 2);
  ASSERT_EQ(h.gemm_curve.size(), 2u);
  EXPECT_DOUBLE_EQ(h.gemm_curve[0].second, 0.5);
  EXPECT_DOUBLE_EQ(h.gemm_curve[1].second, 1.0);
}

TEST(ThisMachine, TwoWorkersShareTheChip) {
  const Hardware h = this_machine_hardware(calibration(), 2);
  EXPECT_DOUBLE_EQ(h.peak_flops, 150e9);                   // min(160 alone, 300 / 2)
  EXPECT_DOUBLE_EQ(h.gemm_efficiency, 100.0 / 150.0);      // min(110 alone, 200 / 2)
  EXPECT_DOUBLE_EQ(h.memory_bytes_per_s, 25e9);            // min(30, 50 / 2)
  EXPECT_DOUBLE_EQ(h.attention_efficiency, 50.0 / 150.0);  // min(60, 100 / 2)
  EXPECT_DOUBLE_EQ(h.memory_bytes, 8e9);
  EXPECT_DOUBLE_EQ(h.cache_bytes, 16e6);              // half the L3 each
  EXPECT_DOUBLE_EQ(h.cache_bytes_per_s, 90e9);        // min(90, 200 / 2)
  EXPECT_DOUBLE_EQ(h.optimizer_params_per_s, 200e6);  // min(250, 400 / 2)
  EXPECT_DOUBLE_EQ(h.kernel_overhead_s, 2e-6);        // the one-thread measurement
}

TEST(ThisMachine, AllReduceBandwidthFromTheLargestLatencyFromTheFastestSmall) {
  const Hardware h = this_machine_hardware(calibration(), 2);
  EXPECT_DOUBLE_EQ(h.intra_bytes_per_s, 16777216.0 / 8e-3);
  // The fastest small size (not the noisy 40 us first one), over the 2 steps
  // of a 2-rank ring.
  EXPECT_DOUBLE_EQ(h.intra_latency_s, 9e-6 / 2);
}

TEST(ThisMachine, MissingFieldsNameTheFix) {
  for (const char* key : {"cores", "compute", "comm", "memory_bytes", "cache_bytes"}) {
    nlohmann::json c = calibration();
    c.erase(key);
    try {
      this_machine_hardware(c, 1);
      ADD_FAILURE() << "no error without " << key;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("brigade bench calibrate"), std::string::npos);
    }
  }
  nlohmann::json c = calibration();
  c["compute"][0]["stream_bytes_per_s"] = -1;
  EXPECT_THROW(this_machine_hardware(c, 2), Error);
}

TEST(ThisMachine, CalibrationsWithoutThePeakAreRefusedWithTheFix) {
  // Written before the peak was recorded: read with the sgemm as the peak,
  // the planner's MFU would not be the one the runs report.
  nlohmann::json old = calibration();
  for (nlohmann::json& entry : old["compute"]) entry.erase("peak_gflops");
  for (int devices : {1, 2}) {  // the all-core entry alone, and both
    try {
      this_machine_hardware(old, devices);
      ADD_FAILURE() << "no error without peak_gflops, " << devices << " device(s)";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("\"peak_gflops\""), std::string::npos) << what;
      EXPECT_NE(what.find("rerun `brigade bench calibrate`"), std::string::npos) << what;
      EXPECT_NE(what.find("--comm-from"), std::string::npos) << what;
    }
  }
  // A peak below what the GEMMs achieved is no peak.
  nlohmann::json c = calibration();
  c["compute"][1]["peak_gflops"] = 150.0;
  EXPECT_THROW(this_machine_hardware(c, 1), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

// this-machine's hardware from a calibration file: a worker's share of the
// cores, the machine's peak, the measured GEMM curve and the all-reduce's
// bandwidth and latency.
#include "brigade/sim/this_machine.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/sim/cost_model.h"
#include "brigade/sim/layout.h"
#include "brigade/sim/transformer_formulas.h"

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

// Two namespace nodes of two workers each on this 2-core machine, 10 Gbit
// links, and a Gloo all-reduce measured at 0.5 GB/s (slower than the link).
nlohmann::json with_gloo() {
  nlohmann::json c = calibration();
  c["comm"]["gloo_all_reduce"] = {{{"bytes", 4096}, {"time_s", 120e-6}},
                                  {{"bytes", 16777216}, {"time_s", 16777216.0 / 0.5e9}}};
  return c;
}

TEST(ThisMachineNodes, NamespaceNodesShareTheCoresAndTheLinkIsTheSlowerOfWireAndGloo) {
  ThisMachineNodes nodes;
  nodes.nodes = 2;
  nodes.link_bytes_per_s = parse_link_rate("10gbit");
  nodes.one_machine = true;
  const Hardware h = this_machine_hardware(with_gloo(), 2, 0, nodes);
  // Each node's launcher gives its 2 workers 1 thread each: 4 threads on 2
  // cores, each worker a quarter of what both cores do together.
  EXPECT_DOUBLE_EQ(h.peak_flops, 75e9);              // min(160, 300 / 4)
  EXPECT_DOUBLE_EQ(h.gemm_efficiency, 50.0 / 75.0);  // min(110, 200 / 4)
  EXPECT_DOUBLE_EQ(h.memory_bytes, 4e9);             // a quarter of the RAM
  EXPECT_DOUBLE_EQ(h.cache_bytes, 8e6);
  EXPECT_EQ(h.gpus_per_node, 2);
  EXPECT_EQ(h.cores, 2);
  EXPECT_TRUE(h.hierarchical_nodes);
  EXPECT_DOUBLE_EQ(h.inter_bytes_per_s, 0.5e9);  // Gloo, below 10 Gbit's 1.2 GB/s
  EXPECT_DOUBLE_EQ(h.inter_latency_s, 60e-6);
  EXPECT_DOUBLE_EQ(h.intra_bytes_per_s, 16777216.0 / 8e-3);  // shm inside a node, as before
  // At 1 Gbit the wire is the limit: its payload share of 125 MB/s.
  nodes.link_bytes_per_s = parse_link_rate("1gbit");
  EXPECT_DOUBLE_EQ(this_machine_hardware(with_gloo(), 2, 0, nodes).inter_bytes_per_s,
                   125e6 * 1448.0 / 1514.0);
  // Separate machines: every node has the cores to itself.
  nodes.one_machine = false;
  EXPECT_DOUBLE_EQ(this_machine_hardware(with_gloo(), 2, 0, nodes).peak_flops, 150e9);
}

TEST(ThisMachineNodes, TheDpAllReduceRunsInsideNodesThenBetweenLeaders) {
  ThisMachineNodes nodes;
  nodes.nodes = 2;
  nodes.link_bytes_per_s = parse_link_rate("1gbit");
  nodes.one_machine = true;
  const Hardware h = this_machine_hardware(with_gloo(), 2, 0, nodes);
  Workload job;
  job.model.n_layer = 2;
  job.model.n_embd = 256;
  job.model.n_head = 4;
  job.model.vocab_size = 256;
  job.seq_len = 64;
  job.model.block_size = 64;
  job.global_batch = 8;
  job.features = brigade_cpu_features();
  Layout l;
  l.dp = 4;
  l.micro = 2;
  const Estimate e = estimate(job, l, h);
  ASSERT_TRUE(e.valid) << e.invalid;
  // Gradients of S bytes: a 2-rank all-reduce inside each node, S over the
  // 2 leaders' ring, a broadcast inside the node; ZeRO 0, nothing gathered.
  const Estimate one_node = estimate(job, l, this_machine_hardware(with_gloo(), 4));
  const double s = 4.0 * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const double expected = (s / h.intra_bytes_per_s + 2 * h.intra_latency_s) +
                          (s / h.inter_bytes_per_s + 2 * h.inter_latency_s) +
                          (0.5 * s / h.intra_bytes_per_s + h.intra_latency_s);
  EXPECT_NEAR(e.dp_comm_s, expected, 1e-9 * expected);
  // Across 1 Gbit links the same all-reduce costs more than on one node.
  EXPECT_GT(e.dp_comm_s, one_node.dp_comm_s);
}

TEST(ThisMachineNodes, LinkRatesAndBadInputNameTheFix) {
  EXPECT_DOUBLE_EQ(parse_link_rate("10gbit"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("800Mbit"), 1e8);
  EXPECT_DOUBLE_EQ(parse_link_rate("2.5gbit"), 312.5e6);
  for (const char* bad : {"10", "gbit", "10gb", "-1gbit", "0mbit", "tengbit", ""}) {
    try {
      parse_link_rate(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("10gbit"), std::string::npos) << e.what();
    }
  }
  // A calibration from before the Gloo figures cannot plan links.
  ThisMachineNodes nodes;
  nodes.nodes = 2;
  nodes.link_bytes_per_s = 1e9;
  try {
    this_machine_hardware(calibration(), 2, 0, nodes);
    ADD_FAILURE() << "no error without comm.gloo_all_reduce";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gloo_all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("brigade bench calibrate"), std::string::npos);
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

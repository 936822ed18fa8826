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

// ZeRO 2 releases the unowned gradient shards after each step's
// reduce-scatter: the owner pays to write them again (refault), and inside
// a node the peer that reduces them reads them in place, mapping each page
// again (peer refault). A calibration from before the second was measured
// leaves it out; ZeRO 1 releases nothing and pays neither.
TEST(ThisMachine, ReleasedGradientsCostTheOwnersRefaultAndThePeersReads) {
  nlohmann::json with_peer = calibration();
  with_peer["compute"][0]["peer_refault_bytes_per_s"] = 4e9;
  const Hardware peer = this_machine_hardware(with_peer, 2);
  const Hardware old = this_machine_hardware(calibration(), 2);
  EXPECT_DOUBLE_EQ(peer.peer_refault_bytes_per_s, 4e9);  // one writer per core
  EXPECT_DOUBLE_EQ(old.peer_refault_bytes_per_s, 0.0);
  Workload job;
  job.model.n_layer = 2;
  job.model.n_embd = 256;
  job.model.n_head = 4;
  job.model.vocab_size = 256;
  job.model.block_size = 64;
  job.seq_len = 64;
  job.global_batch = 8;
  job.features = brigade_cpu_features();
  Layout l;
  l.dp = 2;
  l.micro = 4;
  l.zero = 2;
  const double unowned =
      0.5 * job.features.grad_bytes * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const Estimate with = estimate(job, l, peer), without = estimate(job, l, old);
  ASSERT_TRUE(with.valid && without.valid) << with.invalid << without.invalid;
  EXPECT_NEAR(with.dp_comm_s - without.dp_comm_s, unowned / 4e9, 1e-12);
  EXPECT_NEAR(with.time.dp_exposed_s - without.time.dp_exposed_s, unowned / 4e9, 1e-12);
  // ZeRO 3 releases the same gradient shards (and its weights, which no
  // peer reads in place).
  l.zero = 3;
  EXPECT_NEAR(estimate(job, l, peer).dp_comm_s - estimate(job, l, old).dp_comm_s, unowned / 4e9,
              1e-12);
  l.zero = 1;
  EXPECT_DOUBLE_EQ(estimate(job, l, peer).dp_comm_s, estimate(job, l, old).dp_comm_s);
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

// Two namespace nodes of two workers each on this 2-core machine: a Gloo
// all-reduce measured at 0.5 GB/s (the cores' TCP rate), the staged shm
// path at 1 GB/s.
nlohmann::json with_links() {
  nlohmann::json c = calibration();
  c["comm"]["gloo_all_reduce"] = {{{"bytes", 4096}, {"time_s", 120e-6}},
                                  {{"bytes", 16777216}, {"time_s", 16777216.0 / 0.5e9}}};
  c["comm"]["staged_all_reduce"] = {{{"bytes", 4096}, {"time_s", 30e-6}},
                                    {{"bytes", 16777216}, {"time_s", 16777216.0 / 1e9}}};
  return c;
}

Hardware namespace_nodes(const std::string& link) {
  ThisMachineNodes nodes;
  nodes.nodes = 2;
  nodes.link_bytes_per_s = parse_link_rate(link);
  nodes.one_machine = true;
  return this_machine_hardware(with_links(), 2, 0, nodes);
}

constexpr double kPayload = 1448.0 / 1514.0;  // TCP's data in a full Ethernet frame

TEST(ThisMachineNodes, NamespaceNodesShareTheCoresTheLinksCarryPayload) {
  const Hardware h = namespace_nodes("10gbit");
  // Each node's launcher gives its 2 workers 1 thread each: 4 threads on 2
  // cores, each worker a quarter of what both cores do together.
  EXPECT_DOUBLE_EQ(h.peak_flops, 75e9);              // min(160, 300 / 4)
  EXPECT_DOUBLE_EQ(h.gemm_efficiency, 50.0 / 75.0);  // min(110, 200 / 4)
  EXPECT_DOUBLE_EQ(h.memory_bytes, 4e9);             // a quarter of the RAM
  EXPECT_DOUBLE_EQ(h.cache_bytes, 8e6);
  EXPECT_EQ(h.gpus_per_node, 2);
  EXPECT_EQ(h.cores, 2);
  EXPECT_TRUE(h.hierarchical_nodes);
  EXPECT_DOUBLE_EQ(h.inter_bytes_per_s, 1.25e9 * kPayload);
  EXPECT_DOUBLE_EQ(h.tcp_cpu_bytes_per_s, 0.5e9);
  EXPECT_DOUBLE_EQ(h.inter_latency_s, 60e-6);
  // 4 workers on 2 cores run the shm steps at once, each on half a core,
  // where each of the 2 calibrating workers had a core of its own.
  EXPECT_DOUBLE_EQ(h.node_bytes_per_s, 0.5e9);
  EXPECT_DOUBLE_EQ(h.node_latency_s, 15e-6);
  // So do their page faults, which the calibration's one writer took at
  // 1 GB/s with a core to itself.
  EXPECT_DOUBLE_EQ(h.refault_bytes_per_s, 0.5e9);
  // Separate machines: every node has the cores to itself.
  ThisMachineNodes apart;
  apart.nodes = 2;
  apart.link_bytes_per_s = 1e9;
  const Hardware own = this_machine_hardware(with_links(), 2, 0, apart);
  EXPECT_DOUBLE_EQ(own.peak_flops, 150e9);
  EXPECT_DOUBLE_EQ(own.node_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(own.refault_bytes_per_s, 1e9);
}

Workload small_job(int64_t n_layer, int64_t n_embd) {
  Workload job;
  job.model.n_layer = n_layer;
  job.model.n_embd = n_embd;
  job.model.n_head = 4;
  job.model.vocab_size = 256;
  job.seq_len = 64;
  job.model.block_size = 64;
  job.global_batch = 8;
  job.features = brigade_cpu_features();
  return job;
}

// The data-parallel layout of the 2 x 2 namespace-node runs: dp 4,
// micro-batch 2.
Layout dp4() {
  Layout l;
  l.dp = 4;
  l.micro = 2;
  return l;
}

TEST(ThisMachineNodes, TheWorldAllReduceRunsInsideNodesThenBetweenLeadersThenBroadcasts) {
  const Hardware h = namespace_nodes("1gbit");
  const Workload job = small_job(2, 256);
  Layout l = dp4();
  const Estimate e = estimate(job, l, h);
  ASSERT_TRUE(e.valid) << e.invalid;
  // Gradients of S bytes: a 2-rank staged all-reduce inside each node (4
  // workers on 2 cores: at half the calibrated 1 GB/s), S over the 2
  // leaders' ring at the 1 Gbit link's payload rate (slower than the cores'
  // TCP), the leader's result read by the other member.
  const double s = 4.0 * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const double node = s / 0.5e9 + 2 * 15e-6;
  const double expected = node + (s / (125e6 * kPayload) + 2 * 60e-6) + node;
  EXPECT_NEAR(e.dp_comm_s, expected, 1e-9 * expected);
  // One bucket (the whole 4 MB): nothing overlaps it, all of it shows.
  EXPECT_NEAR(e.time.dp_exposed_s, expected, 1e-9 * expected);
  // ZeRO 1: the reduce-scatter is an all-reduce of a fresh copy (faulted
  // in, read and written); the all-gather gathers a node's 2 shards (S/2)
  // inside it, S among the leaders, then S is read inside the node. All 4
  // workers fault their copies in at once, at half the calibrated 1 GB/s.
  l.zero = 1;
  const Estimate z = estimate(job, l, h);
  ASSERT_TRUE(z.valid) << z.invalid;
  const double copy = 2.0 * s / h.memory_bytes_per_s + s / 0.5e9;
  const double gather = (0.5 * (s / 2) / 0.5e9 + 0.5 * 2 * 15e-6) +
                        (0.5 * s / (125e6 * kPayload) + 0.5 * 2 * 60e-6) + node;
  EXPECT_NEAR(z.dp_comm_s, expected + copy + gather, 1e-9 * z.dp_comm_s);
}

TEST(ThisMachineNodes, ASmallerGroupSpanningNodesIsOneFlatGlooRing) {
  // tp 2 x dp 2 on 2 nodes of 2: the dp groups pair ranks of different
  // nodes, and only the world is hierarchical, so each is a 2-rank Gloo
  // ring at the slower of the cores' TCP and the 10 Gbit link. Both rings
  // run at once: 4 workers do TCP on 2 cores, each at half the 0.5 GB/s
  // that 2 workers, a core each, were calibrated at.
  const Hardware h = namespace_nodes("10gbit");
  const Workload job = small_job(2, 256);
  Layout l;
  l.tp = 2;
  l.dp = 2;
  l.micro = 2;
  const Estimate e = estimate(job, l, h);
  ASSERT_TRUE(e.valid) << e.invalid;
  const double s = 4.0 * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const double expected = s / 0.25e9 + 2 * 60e-6;
  EXPECT_NEAR(e.dp_comm_s, expected, 1e-9 * expected);
}

TEST(ThisMachineNodes, BackwardHidesOnlyTheSlowLinksWaitingNotTheCoresWork) {
  // 12 blocks of 768: ~340 MB of gradients in 25 MB buckets. At 1 Gbit
  // the link's time beyond the cores' TCP work is waiting, which the
  // backward (part of the compute) overlaps; at 10 Gbit the cores' TCP is
  // the limit and all of it shows.
  const Workload job = small_job(12, 768);
  const Layout l = dp4();
  const Estimate slow = estimate(job, l, namespace_nodes("1gbit"));
  const Estimate fast = estimate(job, l, namespace_nodes("10gbit"));
  ASSERT_TRUE(slow.valid && fast.valid);
  EXPECT_NEAR(fast.time.dp_exposed_s, fast.dp_comm_s, 1e-9 * fast.dp_comm_s);
  const double hidden = slow.dp_comm_s - slow.time.dp_exposed_s;
  EXPECT_GT(hidden, 0.0);
  EXPECT_LT(hidden, slow.time.compute_s);
  EXPECT_GT(slow.time.dp_exposed_s, fast.time.dp_exposed_s);
}

// The same calibration on a machine of `cores` cores (the compute figures
// stay those of 1 and 2 threads: only the collectives' share is at stake).
Hardware nodes_on(int64_t cores, int64_t nodes, int64_t per_node, bool one_machine) {
  nlohmann::json c = with_links();
  c["cores"] = cores;
  ThisMachineNodes n;
  n.nodes = nodes;
  n.link_bytes_per_s = parse_link_rate("100gbit");  // the cores' TCP is the limit
  n.one_machine = one_machine;
  return this_machine_hardware(c, per_node, 1, n);
}

TEST(ThisMachineNodes, WorkersBeyondTheCoresShareTheCollectivesCpuWork) {
  // Calibrated by 2 workers, a core each. 2 namespace nodes x 2 workers:
  // on 2 cores each worker has half a core, on 4 a whole one.
  const Hardware two = nodes_on(2, 2, 2, true);
  const Hardware four = nodes_on(4, 2, 2, true);
  EXPECT_DOUBLE_EQ(cpu_comm_share(two, 4), 0.5);
  EXPECT_DOUBLE_EQ(cpu_comm_share(two, 2), 1.0);
  EXPECT_DOUBLE_EQ(cpu_comm_share(four, 4), 1.0);
  EXPECT_DOUBLE_EQ(two.intra_bytes_per_s, 0.5 * four.intra_bytes_per_s);
  // Figures that 4 workers took on 2 cores already carry the half core.
  nlohmann::json by_four = with_links();
  by_four["comm"]["nproc"] = 4;
  ThisMachineNodes n;
  n.nodes = 2;
  n.link_bytes_per_s = 1e9;
  n.one_machine = true;
  const Hardware shared = this_machine_hardware(by_four, 2, 1, n);
  EXPECT_DOUBLE_EQ(cpu_comm_share(shared, 4), 1.0);
  EXPECT_DOUBLE_EQ(shared.node_bytes_per_s, 1e9);
  const Workload job = small_job(2, 256);
  const Layout l = dp4();
  const Estimate over = estimate(job, l, two);
  const Estimate fits = estimate(job, l, four);
  ASSERT_TRUE(over.valid && fits.valid);
  // Every worker runs the node steps (an all-reduce and a broadcast, S
  // each at 2 ranks, plus 2 hops of 15 us, which no core share changes) at
  // once: at half the rate on 2 cores. The leaders' TCP (S plus 2 hops of
  // 60 us) is 2 workers on either machine, so it costs the same.
  const double s = 4.0 * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const double tcp = s / 0.5e9 + 2 * 60e-6;
  const double half_cores = 2.0 * (s / 0.5e9 + 2 * 15e-6) + tcp;
  const double whole_cores = 2.0 * (s / 1e9 + 2 * 15e-6) + tcp;
  EXPECT_NEAR(over.dp_comm_s, half_cores, 1e-9 * half_cores);
  EXPECT_NEAR(fits.dp_comm_s, whole_cores, 1e-9 * whole_cores);
  // 4 namespace nodes of 1 worker: 4 leaders run TCP at once on 2 cores,
  // each at half the calibrated 0.5 GB/s; on separate machines each has a
  // core (and no node step: one worker per node). A 4-rank all-reduce
  // ring: 2 x 3/4 of S and of 4 hops.
  const Estimate leaders = estimate(job, l, nodes_on(2, 4, 1, true));
  const Estimate apart = estimate(job, l, nodes_on(2, 4, 1, false));
  ASSERT_TRUE(leaders.valid && apart.valid);
  const double ring = 2.0 * 3.0 / 4.0;
  const double alone = ring * s / 0.5e9 + ring * 4 * 60e-6;
  const double crowded = ring * s / 0.25e9 + ring * 4 * 60e-6;
  EXPECT_NEAR(apart.dp_comm_s, alone, 1e-9 * alone);
  EXPECT_NEAR(leaders.dp_comm_s, crowded, 1e-9 * crowded);
  // The plan's hardware line gives each rate as calibrated and as the
  // job's workers get it (the calibration's shm all-reduce: 16 MiB in 8 ms).
  const std::string line = nodes_on(2, 4, 1, true).description;
  EXPECT_NE(line.find("shm all-reduce 2.10 -> 1.05 GB/s"), std::string::npos) << line;
  EXPECT_NE(line.find("TCP (Gloo) 0.50 -> 0.25 GB/s + 60 us (4 leaders on 2 cores)"),
            std::string::npos)
      << line;
  const std::string pairs = two.description;
  EXPECT_NE(pairs.find("TCP (Gloo) 0.50 GB/s + 60 us (2 leaders on 2 cores; every worker, in a "
                       "group smaller than the world: 0.50 -> 0.25 GB/s)"),
            std::string::npos)
      << pairs;
  EXPECT_NE(pairs.find("the node step (staged shm) 1.00 -> 0.50 GB/s"), std::string::npos) << pairs;
  EXPECT_EQ(four.description.find("->"), std::string::npos) << four.description;
}

TEST(ThisMachineNodes, CalibratedOnSharedCoresAWorkerWithACoreOfItsOwnIsFaster) {
  // Calibrated by 4 workers on 2 cores (half a core each), a job with a
  // core per worker runs the collectives' CPU work at twice the rate.
  nlohmann::json by_four = with_links();
  by_four["comm"]["nproc"] = 4;
  ThisMachineNodes n;
  n.nodes = 4;
  n.link_bytes_per_s = parse_link_rate("100gbit");
  const Hardware h = this_machine_hardware(by_four, 1, 1, n);  // 4 machines of 1 worker
  EXPECT_DOUBLE_EQ(cpu_comm_share(h, 1), 2.0);
  EXPECT_DOUBLE_EQ(h.intra_bytes_per_s, 2.0 * 16777216.0 / 8e-3);
  EXPECT_DOUBLE_EQ(h.node_bytes_per_s, 2e9);
  // The 4 leaders' ring: each leader's TCP at 1 GB/s, twice the 0.5
  // measured; the link (100 Gbit) is faster still.
  const Workload job = small_job(2, 256);
  const Layout l = dp4();
  const Estimate e = estimate(job, l, h);
  ASSERT_TRUE(e.valid) << e.invalid;
  const double s = 4.0 * stage_params_per_gpu(job.model, job.seq_len, l, true, true);
  const double ring = 2.0 * 3.0 / 4.0;
  const double expected = ring * s / 1e9 + ring * 4 * 60e-6;
  EXPECT_NEAR(e.dp_comm_s, expected, 1e-9 * expected);
}

TEST(ThisMachineNodes, LinkRatesAndBadInputNameTheFix) {
  EXPECT_DOUBLE_EQ(parse_link_rate("10gbit"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("800Mbit"), 1e8);
  EXPECT_DOUBLE_EQ(parse_link_rate("2.5gbit"), 312.5e6);
  EXPECT_DOUBLE_EQ(parse_link_rate("1gbps"), 1e9);  // tc: bytes per second
  EXPECT_DOUBLE_EQ(parse_link_rate("1tbit"), 125e9);
  for (const char* bad : {"10", "gbit", "10gb", "-1gbit", "0mbit", "tengbit", ""}) {
    try {
      parse_link_rate(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("10gbit"), std::string::npos) << e.what();
    }
  }
  // A calibration from before the link figures cannot plan links.
  ThisMachineNodes nodes;
  nodes.nodes = 2;
  nodes.link_bytes_per_s = 1e9;
  for (const char* missing : {"gloo_all_reduce", "staged_all_reduce"}) {
    nlohmann::json c = with_links();
    c["comm"].erase(missing);
    try {
      this_machine_hardware(c, 2, 0, nodes);
      ADD_FAILURE() << "no error without comm." << missing;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("brigade bench calibrate"), std::string::npos);
    }
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

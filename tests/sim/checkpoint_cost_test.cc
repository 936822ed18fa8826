// What checkpointing costs a planned job, worked by hand from the layout.
#include "brigade/sim/checkpoint_cost.h"

#include <gtest/gtest.h>

#include <cmath>

#include "brigade/sim/model_presets.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

TEST(CheckpointCost, SnapshotPersistRestartAndIntervalFromTheLayout) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = preset_workload("175b");
  const Estimate plan = estimate(job, Layout::parse("tp=8,pp=8,dp=16,zero=1,micro=1"), hw);
  ASSERT_TRUE(plan.valid);
  FailureOptions options;
  options.trials = 200;
  const CheckpointReport r = checkpoint_report(job, plan, hw, options);
  const double params = model_params(job.model, job.seq_len);
  // bf16 weights + fp32 master and two moments: 14 bytes per parameter.
  EXPECT_DOUBLE_EQ(r.state_bytes, 14.0 * params);
  EXPECT_EQ(r.nodes, 128);
  // ZeRO 1: all 1024 GPUs hold a share and copy it to the host at 25 GB/s.
  EXPECT_DOUBLE_EQ(r.snapshot_s, r.state_bytes / 1024.0 / 25e9);
  EXPECT_DOUBLE_EQ(r.persist_s, r.state_bytes / 200e9);
  EXPECT_DOUBLE_EQ(r.restart_s, 600.0 + r.state_bytes / 200e9);
  EXPECT_DOUBLE_EQ(r.job_mtbf_s, 6300.0 * 3600.0 / 128.0);
  EXPECT_DOUBLE_EQ(r.daly_s, daly_interval_s(r.snapshot_s, r.job_mtbf_s));
  EXPECT_DOUBLE_EQ(r.interval_s, std::max(r.daly_s, r.persist_s));
  EXPECT_DOUBLE_EQ(r.job_work_hours, 20.0 * params / plan.tokens_per_s / 3600.0);
  EXPECT_EQ(r.monte_carlo.trials, 200);
  EXPECT_NEAR(r.monte_carlo.ettr_mean, r.expected_ettr, 0.01);

  // Without ZeRO only dp rank 0 of each model shard writes: 64 writers.
  const Estimate replicated = estimate(job, Layout::parse("tp=8,pp=8,dp=16,micro=1"), hw);
  EXPECT_DOUBLE_EQ(checkpoint_report(job, replicated, hw, options).snapshot_s,
                   r.state_bytes / 64.0 / 25e9);
}

TEST(CheckpointCost, AJobTooFailureProneToSimulateStillGetsItsAnalysis) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = preset_workload("175b");
  const Estimate plan = estimate(job, Layout::parse("tp=8,pp=8,dp=16,zero=1,micro=1"), hw);
  FailureOptions options;
  options.node_mtbf_hours = 0.5;  // 128 nodes: a failure every 14 s, restarts of 10 minutes
  const CheckpointReport r = checkpoint_report(job, plan, hw, options);
  EXPECT_EQ(r.monte_carlo.trials, 0);
  EXPECT_FALSE(r.monte_carlo_skipped.empty());
  EXPECT_NE(format_checkpoint_report(r).find("no Monte Carlo"), std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

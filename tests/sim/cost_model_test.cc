// The cost model's step time and memory: consistent with the FLOP and memory
// formulas, and moving the right way when a layout changes.
#include "brigade/sim/cost_model.h"

#include <gtest/gtest.h>

#include "brigade/core/error.h"
#include "brigade/sim/model_presets.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

// A device where only FLOPs cost time: memory and links infinitely fast.
Hardware flops_only() {
  Hardware h = hardware_by_name("a100-80g");
  h.memory_bytes_per_s = 1e30;
  h.intra_bytes_per_s = h.inter_bytes_per_s = 1e30;
  h.intra_latency_s = h.inter_latency_s = 0;
  h.kernel_overhead_s = 0;
  h.gemm_efficiency = 1.0;
  return h;
}

Workload gpt3(int64_t global_batch) {
  Workload job = preset_workload("175b");
  job.global_batch = global_batch;
  job.features = SystemFeatures::megatron_2021();
  return job;
}

TEST(CostModel, RingCollectiveTime) {
  // 1 GB all-reduce over 8 ranks at 100 GB/s: 2 * 7/8 * 1e9 / 1e11 = 17.5 ms,
  // plus the ring's 14 steps of 1 us; an all-gather, half the bytes, 7 steps.
  EXPECT_NEAR(ring_collective_s(1e9, 8, 2.0 * 7.0 / 8.0, 100e9, 1e-6), 0.0175 + 14e-6, 1e-15);
  EXPECT_NEAR(ring_collective_s(1e9, 8, 7.0 / 8.0, 100e9, 1e-6), 0.00875 + 7e-6, 1e-15);
  EXPECT_EQ(ring_collective_s(1e9, 1, 0.0, 100e9, 1e-6), 0.0);
}

TEST(CostModel, ComputeTimeIsHardwareFlopsOverPeakWhenOnlyFlopsCost) {
  // With free memory traffic and links, the GEMMs are the step: their FLOPs
  // must be exactly the hardware FLOPs the formulas count (recompute
  // included), split over tp.
  const Hardware hw = flops_only();
  for (PlanRecompute r : {PlanRecompute::kNone, PlanRecompute::kSelective, PlanRecompute::kFull}) {
    Layout l;
    l.tp = 8;
    l.micro = 1;
    l.recompute = r;
    const Workload job = gpt3(4);
    const Estimate e = estimate(job, l, hw);
    ASSERT_TRUE(e.valid) << e.invalid;
    EXPECT_NEAR(e.time.compute_s * hw.peak_flops, e.hardware_flops / 8.0, 1e-9 * e.hardware_flops)
        << plan_recompute_name(r);
    EXPECT_LT(e.time.tp_comm_s, 1e-12);
    EXPECT_NEAR(e.tflops_per_gpu * 1e12, hw.peak_flops, 1e-6 * hw.peak_flops);
  }
}

TEST(CostModel, BubbleIsTheFillAndDrainOfTheSchedule) {
  const Hardware hw = flops_only();
  Workload job = gpt3(64);
  Layout l;
  l.tp = 8;
  l.pp = 8;
  const Estimate plain = estimate(job, l, hw);
  ASSERT_TRUE(plain.valid) << plain.invalid;
  // 64 micro-batches, 8 stages: the slowest stage runs 64 micro-batches and
  // the pipeline idles about 7 stage-times (the mean stage is a little
  // faster than the slowest, which holds the LM head).
  const double per_microbatch = plain.time.compute_s / 64.0;
  EXPECT_GT(plain.time.bubble_s, 6.5 * per_microbatch);
  EXPECT_LE(plain.time.bubble_s, 7.0 * per_microbatch);
  l.vp = 3;  // interleaving divides the bubble by v
  const Estimate interleaved = estimate(job, l, hw);
  EXPECT_NEAR(interleaved.time.bubble_s, plain.time.bubble_s / 3.0, 1e-9);
}

TEST(CostModel, LayoutChangesMoveTimeAndMemoryTheRightWay) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = gpt3(1536);
  Layout base;
  base.tp = 8;
  base.pp = 8;
  base.dp = 16;
  base.micro = 1;
  base.zero = 1;
  const Estimate e = estimate(job, base, hw);
  ASSERT_TRUE(e.valid) << e.invalid;

  Layout full = base;
  full.recompute = PlanRecompute::kFull;
  const Estimate ef = estimate(job, full, hw);
  EXPECT_GT(ef.time.step_s(), e.time.step_s());
  EXPECT_LT(ef.memory.activations, e.memory.activations);
  EXPECT_GT(ef.tflops_per_gpu / ef.mfu, e.tflops_per_gpu / e.mfu);  // recompute counted

  Layout sp = base;
  sp.sp = true;
  EXPECT_LT(estimate(job, sp, hw).memory.activations, e.memory.activations);

  Layout zero0 = base;
  zero0.zero = 0;
  EXPECT_GT(estimate(job, zero0, hw).memory.optimizer, 15.9 * e.memory.optimizer);

  // Twice the GPUs through dp: half the micro-batches per pipeline.
  Layout wider = base;
  wider.dp = 32;
  const Estimate ew = estimate(job, wider, hw);
  EXPECT_EQ(ew.num_microbatches, e.num_microbatches / 2);
  EXPECT_NEAR(ew.time.compute_s, e.time.compute_s / 2.0, 1e-9);
  EXPECT_GT(ew.time.bubble_s / ew.time.step_s(), e.time.bubble_s / e.time.step_s());
}

TEST(CostModel, PipelineTransfersCrossNodesUnlessThePipelineFitsInOne) {
  const Hardware& hw = hardware_by_name("a100-80g");
  Workload job = preset_workload("7.5b");
  job.features = SystemFeatures::megatron_2021();
  // tp 2, dp 2, pp 2: 8 GPUs, one node, NVLink between stages.
  Layout inside = Layout::parse("tp=2,pp=2,dp=2,micro=1");
  // tp 2, dp 2, pp 4: 16 GPUs; stage 1 -> 2 crosses nodes, and the pipeline
  // moves at its slowest link, one NIC per GPU (12x slower than NVLink).
  Layout across = Layout::parse("tp=2,pp=4,dp=2,micro=1");
  const Estimate a = estimate(job, inside, hw), b = estimate(job, across, hw);
  ASSERT_TRUE(a.valid && b.valid) << a.invalid << b.invalid;
  ASSERT_EQ(a.num_microbatches, b.num_microbatches);
  EXPECT_GT(b.time.pp_comm_s, 5.0 * a.time.pp_comm_s);
}

TEST(CostModel, ZeroThreeAlwaysShowsTheFirstBlocksGather) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = preset_workload("175b");
  const Estimate e = estimate(job, Layout::parse("tp=4,dp=256,zero=3,micro=3"), hw);
  ASSERT_TRUE(e.valid) << e.invalid;
  // At least one of 96 blocks' share of every gather is exposed.
  EXPECT_GT(e.time.dp_exposed_s, e.dp_comm_s / 96.0 / 3.0);
}

TEST(CostModel, OverlapHidesDataParallelCommunication) {
  const Hardware& hw = hardware_by_name("a100-80g");
  Workload job = gpt3(1536);
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 16;
  job.features.overlap_dp = false;
  const Estimate exposed = estimate(job, l, hw);
  EXPECT_DOUBLE_EQ(exposed.time.dp_exposed_s, exposed.dp_comm_s);
  // One micro-batch's backward (12 blocks here) hides part of the 5 GB
  // all-reduce over one NIC per GPU.
  job.features.overlap_dp = true;
  const Estimate partly = estimate(job, l, hw);
  EXPECT_LT(partly.time.dp_exposed_s, 0.9 * partly.dp_comm_s);
  // 1.7B on 32 GPUs, micro-batch 16: the backward is long enough to hide all
  // but the last bucket.
  job.model = preset_workload("1.7b").model;
  job.global_batch = 512;
  Layout dp32;
  dp32.dp = 32;
  dp32.micro = 16;
  const Estimate hidden = estimate(job, dp32, hw);
  ASSERT_TRUE(hidden.valid) << hidden.invalid;
  EXPECT_LT(hidden.time.dp_exposed_s, 0.1 * hidden.dp_comm_s);
  EXPECT_GT(hidden.time.dp_exposed_s, 0.0);  // the last bucket always shows
}

TEST(CostModel, MemoryDecidesWhatFits) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = gpt3(1536);
  Layout one_node;  // 175B on 8 GPUs: 175e9 * 16 / 8 bytes of state each
  one_node.tp = 8;
  const Estimate e = estimate(job, one_node, hw);
  ASSERT_TRUE(e.valid);
  EXPECT_FALSE(e.fits);
  EXPECT_GT(e.memory.total(), 300e9);
}

TEST(CostModel, LayoutsThatCannotRunSayWhy) {
  const Hardware& hw = hardware_by_name("a100-80g");
  const Workload job = gpt3(1536);
  auto reason = [&](Layout l) { return estimate(job, l, hw).invalid; };
  Layout l;
  l.tp = 16;
  EXPECT_NE(reason(l).find("spans nodes"), std::string::npos);
  l = {};
  l.tp = 8;
  l.pp = 5;  // 96 layers
  EXPECT_NE(reason(l).find("layers"), std::string::npos);
  l = {};
  l.dp = 7;
  EXPECT_NE(reason(l).find("global batch"), std::string::npos);
  l = {};
  l.vp = 2;
  EXPECT_NE(reason(l).find("virtual"), std::string::npos);
  l = {};
  l.sp = true;
  EXPECT_NE(reason(l).find("tp > 1"), std::string::npos);
  l = {};
  l.pp = 2;
  l.zero = 3;
  EXPECT_NE(reason(l).find("ZeRO"), std::string::npos);
  Workload odd = job;
  odd.model.n_head = 12;
  l = {};
  l.tp = 8;
  EXPECT_NE(estimate(odd, l, hw).invalid.find("heads"), std::string::npos);
}

TEST(Layout, ParsesAndPrintsTheSameForm) {
  const Layout l = Layout::parse("tp=8,pp=8,dp=6,vp=2,zero=1,recompute=full,sp=true,micro=2");
  EXPECT_EQ(l.tp, 8);
  EXPECT_EQ(l.pp, 8);
  EXPECT_EQ(l.dp, 6);
  EXPECT_EQ(l.vp, 2);
  EXPECT_EQ(l.zero, 1);
  EXPECT_EQ(l.recompute, PlanRecompute::kFull);
  EXPECT_TRUE(l.sp);
  EXPECT_EQ(l.micro, 2);
  EXPECT_EQ(Layout::parse(l.to_string()).to_string(), l.to_string());
  EXPECT_THROW(Layout::parse("tp=0"), Error);
  EXPECT_THROW(Layout::parse("tp=8,foo=1"), Error);
  EXPECT_THROW(Layout::parse("zero=4"), Error);
  EXPECT_THROW(Layout::parse("recompute=some"), Error);
  EXPECT_THROW(Layout::parse("tp"), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

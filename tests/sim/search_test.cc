// The configuration search: it finds the fastest layout that fits, respects
// what the caller pins, groups the losers by cause, and the published
// validation rows stay within the targets.
#include "brigade/sim/search.h"

#include <gtest/gtest.h>

#include <cmath>

#include "brigade/core/error.h"
#include "brigade/sim/model_presets.h"
#include "brigade/sim/sweep.h"
#include "brigade/sim/validation.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

TEST(Search, BestLayoutFitsAndIsFastest) {
  const Hardware& hw = hardware_by_name("h100-80g");
  const Workload job = preset_workload("175b");
  const SearchResult r = search_layouts(job, 1024, hw, {}, 1000000);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(static_cast<int64_t>(r.ranked.size()), r.fitting);
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    EXPECT_TRUE(r.ranked[i].fits);
    EXPECT_EQ(r.ranked[i].layout.gpus(), 1024);
    if (i > 0) {
      EXPECT_LE(r.ranked[i - 1].time.step_s(), r.ranked[i].time.step_s());
    }
  }
  // Every fitting loser is counted under exactly one reason, and 175B does
  // not fit without model parallelism: something ran out of memory.
  int64_t losers = 0, oom = 0;
  for (const LossGroup& g : r.losses) {
    (g.reason == LossReason::kOutOfMemory ? oom : losers) += g.count;
    if (g.reason == LossReason::kOutOfMemory) {
      EXPECT_FALSE(g.best.fits);
    } else {
      EXPECT_GE(g.best.time.step_s(), r.ranked.front().time.step_s());
    }
  }
  EXPECT_EQ(losers, r.fitting - 1);
  EXPECT_GT(oom, 0);
}

TEST(Search, PinsAreRespected) {
  const Hardware& hw = hardware_by_name("a100-80g");
  LayoutPins pins;
  pins.tp = 8;
  pins.pp = 8;
  pins.recompute = PlanRecompute::kFull;
  pins.micro = 1;
  const SearchResult r = search_layouts(preset_workload("175b"), 1024, hw, pins, 50);
  ASSERT_FALSE(r.ranked.empty());
  for (const Estimate& e : r.ranked) {
    EXPECT_EQ(e.layout.tp, 8);
    EXPECT_EQ(e.layout.pp, 8);
    EXPECT_EQ(e.layout.dp, 16);
    EXPECT_EQ(e.layout.micro, 1);
    EXPECT_EQ(e.layout.recompute, PlanRecompute::kFull);
  }
}

TEST(Search, NothingFitsSaysOutOfMemory) {
  const SearchResult r = search_layouts(preset_workload("1t"), 8, hardware_by_name("a100-80g"));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_EQ(r.losses[0].reason, LossReason::kOutOfMemory);
}

TEST(Search, LossReasonNamesTheLargestExcess) {
  Estimate winner, loser;
  winner.time.compute_s = loser.time.compute_s = 10;
  loser.time.bubble_s = 2;
  loser.time.tp_comm_s = 1;
  EXPECT_EQ(loss_reason(winner, loser), LossReason::kBubble);
  loser.time.dp_exposed_s = 3;
  EXPECT_EQ(loss_reason(winner, loser), LossReason::kDpComm);
}

TEST(Sweep, DoublesFromLowToHigh) {
  EXPECT_EQ(parse_gpu_range("1024:16384"), (std::vector<int64_t>{1024, 2048, 4096, 8192, 16384}));
  EXPECT_EQ(parse_gpu_range("8:8"), (std::vector<int64_t>{8}));
  EXPECT_EQ(parse_gpu_range("1024:3072"), (std::vector<int64_t>{1024, 2048, 3072}));
  EXPECT_THROW(parse_gpu_range("1:9223372036854775807"), Error);
  EXPECT_THROW(parse_gpu_range("16384:1024"), Error);
  EXPECT_THROW(parse_gpu_range("0:8"), Error);
  EXPECT_THROW(parse_gpu_range("1024"), Error);
  EXPECT_THROW(parse_gpu_range("a:b"), Error);
}

TEST(Sweep, MoreGpusTrainFasterButWaitMore) {
  const GpuSweep s = sweep_gpus(preset_workload("175b"), hardware_by_name("h100-80g"), {256, 1024});
  ASSERT_EQ(s.points.size(), 2u);
  ASSERT_TRUE(s.points[0].feasible && s.points[1].feasible);
  EXPECT_GT(s.points[1].fastest.tokens_per_s, s.points[0].fastest.tokens_per_s);
  auto waiting = [](const Estimate& e) { return e.time.waiting_s() / e.time.step_s(); };
  EXPECT_GT(waiting(s.points[1].fastest), waiting(s.points[0].fastest));
  EXPECT_LE(s.points[1].least_waiting.time.step_s(), 1.05 * s.points[1].fastest.time.step_s());
}

TEST(Search, WithoutDataParallelismZeroIsNotSearched) {
  // On one GPU ZeRO 1-3 would be ZeRO 0 under another name.
  const SearchResult r =
      search_layouts(preset_workload("gpt2-small"), 1, hardware_by_name("a100-80g"), {}, 1000);
  ASSERT_FALSE(r.ranked.empty());
  for (const Estimate& e : r.ranked) EXPECT_EQ(e.layout.zero, 0);
}

TEST(Search, TiesLoseOnMemoryNotOnAComponent) {
  Estimate winner, loser;
  winner.time.compute_s = loser.time.compute_s = 10;
  EXPECT_EQ(loss_reason(winner, loser), LossReason::kTie);
}

TEST(Validation, PublishedRowsAreWithinTheTargets) {
  // The targets on the calibration rows (Narayanan et al. 2021 Table 1
  // and Korthikanti et al. 2022): mean |error| <= 5%, max <= 10%.
  const ValidationSummary v = validate(parse_published_runs(builtin_published_csv()));
  int calibration = 0;
  for (const ValidationRow& row : v.rows) {
    EXPECT_TRUE(row.predicted_ok) << row.run.name;
    if (!row.run.calibration) continue;
    ++calibration;
    EXPECT_LE(std::fabs(row.error), 0.10)
        << row.run.name << " predicted " << row.predicted << " published " << row.run.published;
  }
  EXPECT_EQ(calibration, 6);
  EXPECT_LE(v.calibration_mean_abs_error, 0.05);
}

TEST(Validation, BadRowsAreNamed) {
  const std::string header =
      "name,hardware,layers,heads,hidden,vocab,seq,global_batch,gpus,tp,pp,vp,micro,zero,"
      "recompute,sp,attention,overlap_dp,metric,published,role,source\n";
  const std::string good =
      "x,a100-80g,24,24,2304,51200,2048,512,32,1,1,1,16,0,full,false,unfused-dropout,true,"
      "tflops_per_gpu,137,calibration,a paper, table 1\n";
  const std::vector<PublishedRun> runs = parse_published_runs(header + good);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].source, "a paper, table 1");  // the last column keeps its commas
  auto error_of = [&](const std::string& rows) {
    try {
      parse_published_runs(rows);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string bad = good;
  bad.replace(bad.find("a100-80g"), 8, "a200-80g");
  EXPECT_NE(error_of(header + bad).find("unknown hardware"), std::string::npos);
  bad = good;
  bad.replace(bad.find(",137,"), 5, ",-1,");
  EXPECT_NE(error_of(header + bad).find("line 2: column published"), std::string::npos);
  bad = good;
  bad.replace(bad.find("full"), 4, "most");
  EXPECT_NE(error_of(header + bad).find("column recompute"), std::string::npos);
  EXPECT_NE(error_of("x,y\n").find("header"), std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

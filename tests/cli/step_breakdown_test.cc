// The step-time breakdown end to end: dp 2 and pp 2 runs of a small model
// write, for every step, rank 0's parts and every rank's (one array per
// part) to metrics.jsonl. The steps' windows add up to the loop's own
// time, measured apart (loop_ms), "other" (what no section claims) stays
// small on every rank, every rank updates its parameters, only the
// pipeline has a bubble (the same in bubble_ms_per_stage as in the
// breakdown; 1F1B's last stage's wait for the first's drain counted in
// it), and data parallelism waits on communication; the progress line
// shows the shares.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/small_run.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

// Steps of about 10 ms: long enough that rank 0's metrics line (tenths of a
// millisecond of "other") is a small share.
const std::string kConfig = testing::small_config("steps = 12\n", "[parallel]\nbucket_mb = 0.05\n");

const char* const kParts[] = {"compute_ms", "optimizer_ms", "comm_ms", "bubble_ms",
                              "data_ms",    "ckpt_ms",      "eval_ms", "other_ms"};

struct Totals {
  std::vector<double> step_ms, other_ms;  // by rank
  std::vector<double> worst_other_ms;     // by rank: the largest of one step
  double bubble_ms = 0;
  double loop_ms = 0, rank0_step_ms = 0;  // over steps 2.. (loop_ms has no step 1)
  double longest_step_ms = 0;
  int steps = 0;
};

// Checks every step's parts; returns the sums over steps, by rank.
Totals check_breakdowns(const fs::path& run, size_t ranks) {
  Totals t;
  t.step_ms.assign(ranks, 0.0);
  t.other_ms.assign(ranks, 0.0);
  t.worst_other_ms.assign(ranks, 0.0);
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++t.steps;
    const auto& mine = row.at("breakdown");
    for (const char* part : kParts) {
      const std::string key = std::string(part) + "_per_rank";
      EXPECT_EQ(row.at(key).size(), ranks) << key << ": " << line;
      EXPECT_EQ(row.at(key).at(0), mine.at(part)) << "rank 0's own: " << line;
    }
    EXPECT_EQ(row.at("step_ms_per_rank").size(), ranks) << line;
    EXPECT_EQ(row.at("step_ms_per_rank").at(0), mine.at("step_ms")) << line;
    for (size_t r = 0; r < ranks; ++r) {
      const auto at = [&](const std::string& part) {
        return row.at(part + "_per_rank").at(r).get<double>();
      };
      for (const char* part : kParts) EXPECT_GE(at(part), -1e-6) << part << ": " << line;
      const double step_ms = at("step_ms");
      EXPECT_GT(step_ms, 0) << line;
      EXPECT_GT(at("compute_ms"), 0) << line;
      EXPECT_GT(at("optimizer_ms"), 0) << "every rank updates its parameters: " << line;
      // Every rank here fills micro-batches (dp ranks; the pipeline's first
      // and last stages).
      EXPECT_GT(at("data_ms"), 0) << line;
      // Comm is waited on every step: the stop agreement, the metrics gather.
      EXPECT_GT(at("comm_ms"), 0) << line;
      t.step_ms[r] += step_ms;
      t.other_ms[r] += at("other_ms");
      t.worst_other_ms[r] = std::max(t.worst_other_ms[r], at("other_ms"));
      t.bubble_ms += at("bubble_ms");
    }
    if (row.contains("loop_ms")) {
      const double step_ms = mine.at("step_ms").get<double>();
      t.longest_step_ms = std::max(t.longest_step_ms, step_ms);
      t.loop_ms += row.at("loop_ms").get<double>();
      t.rank0_step_ms += step_ms;
    }
  }
  return t;
}

// The median of `v` (not empty).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t half = v.size() / 2;
  return v.size() % 2 == 1 ? v[half] : 0.5 * (v[half - 1] + v[half]);
}

// Each stage's bubble_ms_per_stage (the trainer's StepMetrics::bubble_ms:
// its receive waits, its send waits and the drain's) against its rank's
// bubble in the breakdown (the same waits, charged to the step's clock),
// with pp alone (stage s is rank s): per rank, the median over steps 3..
// of their difference within 0.1 ms. 0.05 ms at most was measured over pp
// 2 and pp 4 with every schedule; a wait left out of one of them (the
// drain's, or the sends') is milliseconds.
void expect_stage_bubbles_match(const fs::path& run, size_t stages) {
  std::vector<std::vector<double>> gaps(stages);
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss") || row.at("step").get<int64_t>() <= 2) continue;
    ASSERT_EQ(row.at("bubble_ms_per_stage").size(), stages) << line;
    for (size_t s = 0; s < stages; ++s) {
      gaps[s].push_back(std::abs(row.at("bubble_ms_per_stage").at(s).get<double>() -
                                 row.at("bubble_ms_per_rank").at(s).get<double>()));
    }
  }
  for (size_t s = 0; s < stages; ++s) {
    ASSERT_FALSE(gaps[s].empty());
    EXPECT_LT(median_of(gaps[s]), 0.1)
        << "stage " << s << ": bubble_ms_per_stage against the breakdown's bubble, ms";
  }
}

void expect_accounted(const Totals& t) {
  // The loop's own clock (from one step's end to the next) and the steps'
  // windows cover the same time, but for where each starts and ends (before
  // and after the gather and the saves' poll): within 2%, or one step.
  EXPECT_GT(t.loop_ms, 0);
  EXPECT_NEAR(t.rank0_step_ms, t.loop_ms, std::max(0.02 * t.loop_ms, t.longest_step_ms))
      << "the breakdown's step windows against loop_ms";
  // Over the run rather than per step, leaving out each rank's worst step:
  // a rank preempted for a time slice inside the loop's bookkeeping makes
  // one step's share large, where a section the clock missed would show in
  // every step.
  for (size_t r = 0; r < t.step_ms.size(); ++r) {
    EXPECT_LT(t.other_ms[r] - t.worst_other_ms[r], 0.05 * t.step_ms[r])
        << "rank " << r << ": other " << t.other_ms[r] << " ms of " << t.step_ms[r]
        << " (the worst step's " << t.worst_other_ms[r] << " left out)";
  }
}

TEST(StepBreakdown, DataParallelPartsAddUpWithCommAndNoBubble) {
  const testing::SmallRun small("brigade_breakdown", kConfig);
  const fs::path& run = small.run;
  const auto result = small.train(2);
  ASSERT_EQ(result.status, 0) << result.err;
  const Totals t = check_breakdowns(run, 2);
  EXPECT_EQ(t.steps, 12);
  expect_accounted(t);
  EXPECT_EQ(t.bubble_ms, 0.0) << "no pipeline, no bubble";
  EXPECT_NE(result.err.find("| compute "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("% comm "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("% bubble 0% data "), std::string::npos) << result.err;
}

TEST(StepBreakdown, PipelinePartsAddUpWithABubbleOnEveryStage) {
  const testing::SmallRun small("brigade_breakdown", kConfig);
  const fs::path& run = small.run;
  const auto result = small.train(2, {"--set", "parallel.pp=2"});
  ASSERT_EQ(result.status, 0) << result.err;
  const Totals t = check_breakdowns(run, 2);
  EXPECT_EQ(t.steps, 12);
  expect_accounted(t);
  // Every stage waits on its peer every step (the first for gradients,
  // the last for activations).
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    for (const auto& bubble : row.at("bubble_ms_per_rank")) {
      EXPECT_GT(bubble.get<double>(), 0) << line;
    }
  }
  expect_stage_bubbles_match(run, 2);
}

// 1F1B over 2 stages, m = grad_accum = 2, the first stage 3 blocks and the
// last 1 (with the head and the loss, about 0.43 of the first's work):
// the last stage idles at the fill and, longest, at the drain, where it
// waits out the first's last backward in the losses' sum at the step's
// end. That wait is bubble, not comm. Checked against the last stage's
// own comm, per step, bubble / (bubble + comm), so that the machine's
// speed and load, which stretch both, cancel: 0.74-0.91 measured across a
// 15x range of step times and loads up to 3.5x, 0.24-0.46 with the drain
// counted as comm; the median over steps 3.., in the breakdown and in
// bubble_ms_per_stage (what compare_pipeline.py reads), against 0.6.
TEST(StepBreakdown, PipelineLastStageWaitsOutTheFirstsDrainAsBubble) {
  const testing::SmallRun small("brigade_breakdown", kConfig);
  const fs::path& run = small.run;
  const auto result =
      small.train(2, {"--set", "parallel.pp=2", "--set", "parallel.schedule=\"1f1b\"", "--set",
                      "model.n_layer=4", "--set", "parallel.stage_layers=[3,1]"});
  ASSERT_EQ(result.status, 0) << result.err;
  const Totals t = check_breakdowns(run, 2);
  EXPECT_EQ(t.steps, 12);
  expect_accounted(t);
  expect_stage_bubbles_match(run, 2);
  std::vector<double> breakdown_share, stage_share, over_first_compute;
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss") || row.at("step").get<int64_t>() <= 2) continue;
    const double comm = row.at("comm_ms_per_rank").at(1).get<double>();
    const double bubble = row.at("bubble_ms_per_rank").at(1).get<double>();
    const double stage_bubble = row.at("bubble_ms_per_stage").at(1).get<double>();
    breakdown_share.push_back(bubble / (bubble + comm));
    stage_share.push_back(stage_bubble / (stage_bubble + comm));
    over_first_compute.push_back(bubble / row.at("compute_ms_per_rank").at(0).get<double>());
  }
  ASSERT_EQ(breakdown_share.size(), 10u);
  EXPECT_GT(median_of(breakdown_share), 0.6)
      << "the last stage's bubble over its bubble and comm, in the breakdown: the drain it "
         "waits out at the step's end is bubble";
  EXPECT_GT(median_of(stage_share), 0.6) << "the same with bubble_ms_per_stage";
  // A loose guard on the bubble's size, for the drain's wait falling into
  // compute (which the checks above miss: the bubble would lose it in both
  // accountings alike, and comm would stay small). Against the first
  // stage's compute it is not scale-free: it falls toward ~0.57 as compute
  // outgrows the fixed latencies (0.87 with 3.4 ms steps, 0.70-0.74 here,
  // 0.50-0.56 with 38-51 ms), and without the drain it is 0.17-0.31 but
  // up to 0.47 on a fast or loaded machine, where this guard no longer sees
  // the loss (0.46 measured with the drain moved into compute, load 3.5x).
  EXPECT_GT(median_of(over_first_compute), 0.4)
      << "the last stage's bubble over the first stage's compute, in the breakdown";
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

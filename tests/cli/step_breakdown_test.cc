// The step-time breakdown end to end: dp 2 and pp 2 runs of a small model
// write, for every step, rank 0's parts and every rank's to metrics.jsonl.
// They add up to the measured step time, "other" (what no section claims)
// stays small, only the pipeline has a bubble, and data parallelism waits
// on communication; the progress line shows the shares.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

// Steps of about 10 ms: long enough that rank 0's metrics line (tenths of a
// millisecond of "other") is a small share.
constexpr char kConfig[] = R"([model]
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
vocab_size = 64
[train]
micro_batch = 4
grad_accum = 2
steps = 12
[data]
synthetic = true
[parallel]
bucket_mb = 0.05
)";

const char* const kParts[] = {"compute_ms", "optimizer_ms", "comm_ms", "bubble_ms",
                              "data_ms",    "ckpt_ms",      "eval_ms", "other_ms"};

struct Totals {
  double step_ms = 0, other_ms = 0, bubble_ms = 0, comm_ms = 0;
  int steps = 0;
};

// Checks every step's parts against its step time; returns the sums over
// steps and ranks.
Totals check_breakdowns(const fs::path& run, size_t ranks) {
  Totals t;
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++t.steps;
    const auto& mine = row.at("breakdown");
    EXPECT_EQ(mine, row.at("breakdown_by_rank").at(0)) << "rank 0's own: " << line;
    EXPECT_EQ(row.at("breakdown_by_rank").size(), ranks) << line;
    EXPECT_EQ(row.at("section_compute_ms_per_rank").size(), ranks) << line;
    for (const auto& b : row.at("breakdown_by_rank")) {
      double sum = 0;
      for (const char* part : kParts) {
        const double v = b.at(part).get<double>();
        EXPECT_GE(v, -1e-6) << part << ": " << line;
        sum += v;
      }
      const double step_ms = b.at("step_ms").get<double>();
      EXPECT_GT(step_ms, 0) << line;
      EXPECT_NEAR(sum, step_ms, 0.02 * step_ms) << line;
      EXPECT_GT(b.at("compute_ms").get<double>(), 0) << line;
      // Every rank here fills micro-batches (dp ranks; the pipeline's first
      // and last stages).
      EXPECT_GT(b.at("data_ms").get<double>(), 0) << line;
      t.step_ms += step_ms;
      t.other_ms += b.at("other_ms").get<double>();
      t.bubble_ms += b.at("bubble_ms").get<double>();
      t.comm_ms += b.at("comm_ms").get<double>();
      // Comm is waited on every step: the stop agreement, the metrics gather.
      EXPECT_GT(b.at("comm_ms").get<double>(), 0) << line;
    }
  }
  return t;
}

void expect_other_small(const Totals& t) {
  // Over the run rather than per step: a rank preempted for a time slice
  // inside the loop's bookkeeping would make one step's share large.
  EXPECT_LT(t.other_ms, 0.05 * t.step_ms) << "other " << t.other_ms << " ms of " << t.step_ms;
}

TEST(StepBreakdown, DataParallelPartsAddUpWithCommAndNoBubble) {
  testing::TempDir dir("brigade_breakdown");
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << kConfig;
  const auto result = run_brigade({"train", "--nproc", "2", config.string(), "--set",
                                   "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  const Totals t = check_breakdowns(run, 2);
  EXPECT_EQ(t.steps, 12);
  expect_other_small(t);
  EXPECT_EQ(t.bubble_ms, 0.0) << "no pipeline, no bubble";
  EXPECT_NE(result.err.find("| compute "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("% comm "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("% bubble 0% data "), std::string::npos) << result.err;
}

TEST(StepBreakdown, PipelinePartsAddUpWithABubbleOnEveryStage) {
  testing::TempDir dir("brigade_breakdown");
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << kConfig;
  const auto result =
      run_brigade({"train", "--nproc", "2", config.string(), "--set", "parallel.pp=2", "--set",
                   "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  const Totals t = check_breakdowns(run, 2);
  EXPECT_EQ(t.steps, 12);
  expect_other_small(t);
  // Every stage waits on its peer every step (the first for gradients,
  // the last for activations).
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    for (const auto& b : row.at("breakdown_by_rank")) {
      EXPECT_GT(b.at("bubble_ms").get<double>(), 0) << line;
    }
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

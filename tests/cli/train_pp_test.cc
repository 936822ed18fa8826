// `brigade train --nproc 4 --set parallel.tp=2 --set parallel.pp=2` end to
// end: the real binary runs a tp 2 x pp 2 mesh, prints it and the
// schedule's theoretical bubble, writes each stage's measured bubble to
// metrics.jsonl, and saves a global checkpoint that one process resumes and
// saves again with the same `ckpt hash`; the same for interleaved 1F1B
// over 2 stages of 2 chunks. Pipeline shapes that cannot run
// are refused by the launcher with one line naming the numbers and the fix,
// before any worker starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/layout_checks.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
grad_accum = 2
steps = 4
[data]
synthetic = true
)";

TEST(TrainPipelineParallel, Tp2Pp2TrainsReportsAndSavesAGlobalCheckpoint) {
  testing::TempDir dir("brigade_train_pp");
  const fs::path run = dir.path() / "run";
  const fs::path config = testing::write_tiny_config(dir.path(), kTraining);
  const auto result = run_brigade(
      {"train", "--nproc", "4", config.string(), "--set", "parallel.tp=2", "--set", "parallel.pp=2",
       "--set", "parallel.schedule=\"gpipe\"", "--set", "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("mesh dp 1 x tp 2 x pp 2"), std::string::npos) << result.err;
  // GPipe, 2 stages, 2 micro-batches: (p-1)/(m+p-1) = 1/3 of the step.
  EXPECT_NE(result.err.find("pipeline: gpipe over 2 stages (blocks [0, 1) [1, 2)), 2 "
                            "micro-batches; theoretical bubble 33.3%"),
            std::string::npos)
      << result.err;
  std::ifstream metrics(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++steps;
    const auto bubbles = row.at("bubble_ms_per_stage").get<std::vector<double>>();
    ASSERT_EQ(bubbles.size(), 2u) << line;
    for (const double b : bubbles) EXPECT_GT(b, 0.0) << line;
  }
  EXPECT_EQ(steps, 4);
  // One process resumes the checkpoint the four wrote and saves it at once:
  // the same tensors, the same hash.
  testing::expect_one_process_saves_the_same(config, run, dir.path() / "again", {"train.steps=4"});
}

// Interleaved 1F1B (4 blocks, 2 stages x 2 chunks): the start line names
// each stage's chunks and a theoretical bubble below 1F1B's for the same
// stages and micro-batches, every stage's measured bubble is in
// metrics.jsonl, and one process resumes the checkpoint with the same hash.
TEST(TrainPipelineParallel, InterleavedTrainsReportsAndSavesAGlobalCheckpoint) {
  testing::TempDir dir("brigade_train_pp");
  const fs::path run = dir.path() / "run";
  const fs::path config = testing::write_tiny_config(dir.path(), kTraining);
  const std::vector<std::string> four_blocks = {"--set", "model.n_layer=4"};
  std::vector<std::string> args = {"train", "--nproc",
                                   "2",     config.string(),
                                   "--set", "parallel.pp=2",
                                   "--set", "parallel.schedule=\"interleaved\"",
                                   "--set", "parallel.virtual_stages=2",
                                   "--set", "train.run_dir=\"" + run.string() + "\""};
  args.insert(args.end(), four_blocks.begin(), four_blocks.end());
  const auto result = run_brigade(args);
  ASSERT_EQ(result.status, 0) << result.err;
  const std::string start =
      "pipeline: interleaved over 2 stages (blocks [0, 1)+[2, 3) [1, 2)+[3, 4)), 2 "
      "micro-batches; theoretical bubble ";
  const size_t at = result.err.find(start);
  ASSERT_NE(at, std::string::npos) << result.err;
  // 1F1B, 2 stages, 2 micro-batches: (p-1)/(m+p-1) = 33.3% of the step.
  EXPECT_LT(std::stod(result.err.substr(at + start.size())), 33.3) << result.err;
  std::ifstream metrics(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++steps;
    const auto bubbles = row.at("bubble_ms_per_stage").get<std::vector<double>>();
    ASSERT_EQ(bubbles.size(), 2u) << line;
    for (const double b : bubbles) EXPECT_GT(b, 0.0) << line;
  }
  EXPECT_EQ(steps, 4);
  testing::expect_one_process_saves_the_same(config, run, dir.path() / "again",
                                             {"train.steps=4", "model.n_layer=4"});
}

// Refused by the launcher itself: one line, and no worker ever ran.
void expect_refused(const std::vector<std::string>& sets, int nproc, const std::string& message) {
  testing::TempDir dir("brigade_train_pp");
  const fs::path run = dir.path() / "run";
  std::vector<std::string> args = {"train",
                                   "--nproc",
                                   std::to_string(nproc),
                                   testing::write_tiny_config(dir.path(), kTraining).string(),
                                   "--set",
                                   "train.run_dir=\"" + run.string() + "\""};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  testing::expect_refused_before_starting(run_brigade(args), message, run);
}

TEST(TrainPipelineParallel, ShapesThatCannotRunAreRefusedBeforeStarting) {
  // The tiny model has 2 blocks.
  expect_refused({"parallel.pp=3", "train.grad_accum=3"}, 3,
                 "parallel.pp = 3 stages but the model has n_layer = 2");
  expect_refused({"parallel.pp=2", "parallel.stage_layers=[2, 1]"}, 2,
                 "parallel.stage_layers = [2, 1] must give 2 positive block counts");
  expect_refused({"parallel.pp=2", "train.grad_accum=1"}, 2, "set train.grad_accum >= 2");
  expect_refused({"parallel.pp=2"}, 3,
                 "--nproc 3 is not a multiple of parallel.tp = 1 times "
                 "parallel.pp = 2");
  expect_refused({"parallel.pp=2", "parallel.zero=3"}, 4, "ZeRO 3 does not run with pipeline");
  const std::string interleaved = "parallel.schedule=\"interleaved\"";
  expect_refused({"parallel.pp=2", interleaved, "parallel.virtual_stages=2"}, 2,
                 "n_layer = 2 is not a multiple of 4");
  expect_refused({"model.n_layer=4", "parallel.pp=2", interleaved, "parallel.virtual_stages=2",
                  "parallel.stage_layers=[2, 2]"},
                 2, "parallel.stage_layers is given, but the interleaved schedule");
  expect_refused({"model.n_layer=4", "parallel.pp=2", interleaved, "parallel.virtual_stages=2",
                  "train.grad_accum=3"},
                 2, "train.grad_accum = 3 micro-batches is not a multiple of parallel.pp = 2");
  expect_refused({"parallel.pp=2", interleaved, "parallel.virtual_stages=0"}, 2,
                 "parallel.virtual_stages = 0: it must be at least 1");
  expect_refused({interleaved, "parallel.virtual_stages=2"}, 1,
                 "parallel.schedule = \"interleaved\" needs parallel.pp >= 2 stages, got 1");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

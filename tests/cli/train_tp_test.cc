// `brigade train --nproc 4 --set parallel.tp=2` end to end: the real binary
// runs a dp 2 x tp 2 mesh, says so, reports the tensor-parallel
// communication per step, and saves a global checkpoint that one process
// resumes and saves again with the same `ckpt hash`. Shapes tp cannot
// split, an --nproc tp does not divide, and sequence parallelism over a
// block_size tp does not divide, are refused by the launcher with one line
// naming the numbers, before any worker starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/layout_checks.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::expect_refused_before_starting;
using testing::run_brigade;
using testing::trimmed;

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 4
[data]
synthetic = true
)";

TEST(TrainTensorParallel, Dp2Tp2TrainsReportsAndSavesAGlobalCheckpoint) {
  testing::TempDir dir("brigade_train_tp");
  const fs::path run = dir.path() / "run";
  const fs::path config = testing::write_tiny_config(dir.path(), kTraining);
  const auto result =
      run_brigade({"train", "--nproc", "4", config.string(), "--set", "parallel.tp=2", "--set",
                   "parallel.zero=1", "--set", "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("mesh dp 2 x tp 2, ZeRO 1"), std::string::npos) << result.err;
  std::ifstream metrics(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++steps;
    EXPECT_GT(row.at("tp_comm_ms").get<double>(), 0.0) << line;
    EXPECT_GE(row.at("exposed_comm_ms").get<double>(), row.at("tp_comm_ms").get<double>()) << line;
  }
  EXPECT_EQ(steps, 4);
  const auto inspect = run_brigade({"ckpt", "inspect", run.string()});
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("\"tp\":2"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("shard_00003.safetensors"), std::string::npos) << inspect.out;
  // One process, the same global batch (2 dp ranks x 1 micro-batch each).
  testing::expect_one_process_saves_the_same(config, run, dir.path() / "again",
                                             {"train.grad_accum=2"});
}

// The groups over gloo (what ranks on different nodes use): the same run,
// the same checkpoint as over shm.
TEST(TrainTensorParallel, GlooGroupsTrainTheSameModelAsShm) {
  testing::TempDir dir("brigade_train_tp");
  const fs::path config = testing::write_tiny_config(dir.path(), kTraining);
  std::string hashes[2];
  const char* backends[] = {"shm", "gloo"};
  for (int i = 0; i < 2; ++i) {
    const fs::path run = dir.path() / backends[i];
    const auto result =
        run_brigade({"train", "--nproc", "4", config.string(), "--set", "parallel.tp=2", "--set",
                     std::string("parallel.backend=\"") + backends[i] + "\"", "--set",
                     "train.run_dir=\"" + run.string() + "\""});
    ASSERT_EQ(result.status, 0) << backends[i] << ": " << result.err;
    const auto hash = run_brigade({"ckpt", "hash", run.string()});
    ASSERT_EQ(hash.status, 0) << hash.err;
    hashes[i] = trimmed(hash.out);
  }
  // Sums of two ranks are the same in any order; so are the runs.
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST(TrainTensorParallel, NprocThatTpDoesNotDivideIsRefusedBeforeStarting) {
  testing::TempDir dir("brigade_train_tp");
  const fs::path run = dir.path() / "run";
  const auto result = run_brigade(
      {"train", "--nproc", "3", testing::write_tiny_config(dir.path(), kTraining).string(), "--set",
       "parallel.tp=2", "--set", "train.run_dir=\"" + run.string() + "\""});
  expect_refused_before_starting(result, "--nproc 3 is not a multiple of parallel.tp = 2", run);
}

TEST(TrainTensorParallel, HeadsThatTpDoesNotDivideAreRefusedBeforeStarting) {
  testing::TempDir dir("brigade_train_tp");
  const fs::path run = dir.path() / "run";
  // The tiny model has 2 heads.
  const auto result = run_brigade(
      {"train", "--nproc", "4", testing::write_tiny_config(dir.path(), kTraining).string(), "--set",
       "parallel.tp=4", "--set", "train.run_dir=\"" + run.string() + "\""});
  expect_refused_before_starting(result, "parallel.tp = 4 does not divide model.n_head = 2", run);
}

TEST(TrainTensorParallel, SequenceParallelismOverASequenceTpDoesNotDivideIsRefusedBeforeStarting) {
  testing::TempDir dir("brigade_train_tp");
  const fs::path run = dir.path() / "run";
  const auto result = run_brigade(
      {"train", "--nproc", "2", testing::write_tiny_config(dir.path(), kTraining).string(), "--set",
       "parallel.tp=2", "--set", "parallel.sequence_parallel=true", "--set", "model.block_size=15",
       "--set", "train.run_dir=\"" + run.string() + "\""});
  expect_refused_before_starting(result, "model.block_size = 15 is not a multiple of 2", run);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// The long no-false-alarm run of issue 15: 1,000 steps of the tiny model on
// four data-parallel ranks, their parameters and moments compared before every update
// and their gradients replayed in every step,
// with no incident. sdc_test.cc runs a few dozen steps in the fast suite.
// And the gradient flip of sdc_test.cc under the ZeRO stages it leaves out.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

TEST(SilentCorruptionSlow, AThousandCleanStepsCheckedEveryStepRaiseNoAlarm) {
  testing::TempDir dir("brigade_sdc_slow");
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << R"(
[train]
micro_batch = 2
steps = 1000
[data]
synthetic = true
[diag]
sdc_every = 1
)";
  const auto r = testing::run_brigade({"train", "--nproc", "4", config.string(), "--set",
                                       "train.run_dir=\"" + (dir.path() / "run").string() + "\""},
                                      std::chrono::seconds(600));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("0 incidents"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("silent data corruption"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)));
}

// sdc_test.cc's gradient flip under ZeRO 1 and 2: found by the check
// step's replay before the reduce-scatter, rank 1 named, and the rollback
// ends bit for bit where a fault-free run does.
TEST(SilentCorruptionSlow, AGradientFlipUnderZero1And2IsFoundAndRolledBack) {
  testing::TempDir dir("brigade_sdc_slow");
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << R"(
[train]
micro_batch = 2
steps = 8
seed = 5
snapshot_every = 1
[data]
synthetic = true
[parallel]
timeout_s = 20
bucket_mb = 0.01
[diag]
sdc_every = 3
)";
  const auto train = [&](const std::string& run, const std::string& zero,
                         const std::string& inject) {
    std::vector<std::string> args = {
        "train", "--nproc",
        "2",     config.string(),
        "--set", "parallel.zero=" + zero,
        "--set", "train.run_dir=\"" + (dir.path() / run).string() + "\""};
    if (!inject.empty()) args.insert(args.end(), {"--inject", inject});
    return testing::run_brigade(args, std::chrono::seconds(120));
  };
  const auto hash = [&](const std::string& run) {
    return testing::run_brigade({"ckpt", "hash", (dir.path() / run).string()}).out;
  };
  for (const std::string zero : {"1", "2"}) {
    SCOPED_TRACE("ZeRO " + zero);
    const auto clean = train("clean" + zero, zero, "");
    ASSERT_EQ(clean.status, 0) << clean.err;
    const auto r = train("run" + zero, zero, "sdc:rank=1:step=4:what=grad");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("incident 1: rank 1 (node 0): silent data corruption after step 3: rank "
                         "1's local gradient of step 4 (before the reduce)"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("rank 1's own computation was off"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("from the in-memory snapshot of step 2"), std::string::npos) << r.err;
    EXPECT_EQ(hash("run" + zero), hash("clean" + zero));
  }
  EXPECT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

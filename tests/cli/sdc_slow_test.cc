// The long no-false-alarm run of issue 15: 1,000 steps of the tiny model on
// four data-parallel ranks, their parameters and moments compared before every update,
// with no incident. sdc_test.cc runs a few hundred steps in the fast suite.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// No false straggler alarm over 1,000 clean steps of dp 2 (the issue's
// check; on this project's 2-core machine, loaded by other builds).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

TEST(StragglerSlow, AThousandCleanStepsNameNoStraggler) {
  testing::TempDir dir("brigade_straggler_slow");
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << R"([model]
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
vocab_size = 64
[train]
micro_batch = 4
grad_accum = 2
steps = 1000
[data]
synthetic = true
)";
  const auto result = run_brigade(
      {"train", "--nproc", "2", config.string(), "--set", "train.run_dir=\"" + run.string() + "\""},
      std::chrono::seconds(600));
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err.find("straggler: "), std::string::npos) << result.err;
  std::ifstream metrics(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    if (line.find("\"loss\"") != std::string::npos) ++steps;
  }
  EXPECT_EQ(steps, 1000);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

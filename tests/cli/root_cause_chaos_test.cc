// Root cause under chaos (label `chaos`; BRIGADE_CHAOS_TRIALS trials, 5 by
// default as CI runs them (its time is tight), 50 for the long form): each trial injects a
// random fault kind (kill, stop, skip, mismatch) on a random rank after a
// random step of a 4-rank run, and the launcher's one incident line must
// name that rank and kind (cli/root_cause_trial.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "cli/root_cause_trial.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

int trials() {
  const char* value = std::getenv("BRIGADE_CHAOS_TRIALS");
  return value != nullptr ? std::max(1, std::atoi(value)) : 5;
}

TEST(RootCauseChaos, EveryTrialNamesTheInjectedRankAndKind) {
  testing::TempDir dir("brigade_root_cause_chaos");
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << testing::kRootCauseTraining;
  const unsigned seed = std::random_device()();
  std::printf("[ chaos    ] seed %u, %d trials\n", seed, trials());
  std::mt19937 random(seed);
  const char* kinds[] = {"kill", "stop", "skip", "mismatch"};
  for (int t = 0; t < trials() && !HasFailure(); ++t) {
    const std::string kind = kinds[std::uniform_int_distribution<int>(0, 3)(random)];
    const int rank = std::uniform_int_distribution<int>(0, 3)(random);
    const int step = std::uniform_int_distribution<int>(1, 6)(random);
    testing::root_cause_trial(config, dir.path() / ("trial" + std::to_string(t)), kind, rank, step);
  }
  EXPECT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

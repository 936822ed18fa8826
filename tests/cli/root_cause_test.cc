// Root cause end to end (diag/root_cause.h): each fault kind on a random
// rank of a 4-rank `brigade train --nproc 4` is named in the launcher's one
// incident line and in incidents.jsonl; `brigade diagnose RUN_DIR` says the
// same from the saved evidence, and refuses a directory without any.
// root_cause_chaos_test.cc repeats the trials BRIGADE_CHAOS_TRIALS times.
#include <gtest/gtest.h>

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

class RootCauseEndToEnd : public ::testing::TestWithParam<const char*> {
 protected:
  fs::path config() {
    const fs::path path = dir_.path() / "config.toml";
    if (!fs::exists(path)) {
      std::ofstream(path) << testing::kTinyModelToml << testing::kRootCauseTraining;
    }
    return path;
  }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  testing::TempDir dir_{"brigade_root_cause"};
};

TEST_P(RootCauseEndToEnd, TheLineNamesTheInjectedRankAndKind) {
  const std::string kind = GetParam();
  std::random_device seed;
  std::mt19937 random(seed());
  const int rank = std::uniform_int_distribution<int>(0, 3)(random);
  const int step = std::uniform_int_distribution<int>(2, 5)(random);
  const fs::path run = dir_.path() / "run";
  const std::string line = testing::root_cause_trial(config(), run, kind, rank, step);
  // Offline, from the evidence alone: the same line.
  const auto offline = testing::run_brigade({"diagnose", run.string()});
  EXPECT_EQ(offline.status, 0) << offline.err;
  EXPECT_EQ(offline.out, line + "\n");
  // A missing timeline is written; one that cannot be is said, and the line
  // still printed with status 0 (an archived run directory may be read-only).
  const fs::path timeline = run / "incidents" / "1" / "trace.json";
  fs::remove(timeline);
  EXPECT_EQ(testing::run_brigade({"diagnose", run.string()}).status, 0);
  EXPECT_TRUE(fs::is_regular_file(timeline));
  fs::remove(timeline);
  fs::create_directory(timeline);
  const auto blocked = testing::run_brigade({"diagnose", run.string()});
  EXPECT_EQ(blocked.status, 0) << blocked.err;
  EXPECT_EQ(blocked.out, line + "\n");
  EXPECT_NE(blocked.err.find("no timeline written for incident 1"), std::string::npos)
      << blocked.err;
}

// A slow rank is behind at every collective; the stopped one is still the
// one named.
TEST_F(RootCauseEndToEnd, ASlowRankIsNotBlamedForAHang) {
  std::random_device seed;
  std::mt19937 random(seed());
  const int stopped = std::uniform_int_distribution<int>(0, 3)(random);
  const int slow = (stopped + std::uniform_int_distribution<int>(1, 3)(random)) % 4;
  testing::root_cause_trial(config(), dir_.path() / "run", "stop", stopped, 3,
                            "slow:rank=" + std::to_string(slow) + ":factor=4");
}

INSTANTIATE_TEST_SUITE_P(Kinds, RootCauseEndToEnd,
                         ::testing::Values("kill", "stop", "skip", "mismatch"));

TEST(Diagnose, ADirectoryWithoutEvidenceIsRefusedSayingWhy) {
  testing::TempDir dir("brigade_diagnose");
  const auto r = testing::run_brigade({"diagnose", dir.path().string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("holds no incident evidence"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("brigade train --nproc N"), std::string::npos) << r.err;
}

TEST(Diagnose, AnUnreadableIncidentIsNamedAndTheOthersStillDiagnosed) {
  testing::TempDir dir("brigade_diagnose");
  const fs::path incidents = dir.path() / "incidents";
  // 1: damaged; 2: a crash seen by node 0's agent; a directory whose name
  // is no incident number the agent writes (too many digits) is not one.
  fs::create_directories(incidents / "1");
  std::ofstream(incidents / "1" / "agent_node0.json") << "{\"incident\": 1, \"workers\": 5}";
  fs::create_directories(incidents / "2");
  std::ofstream(incidents / "2" / "agent_node0.json")
      << R"({"incident": 2, "nproc_per_node": 1, "detected": {"rank": 0, "what": "rank 0 died"},
             "workers": [{"rank": 0, "node": 0, "running": false, "exit_code": null,
                          "signal": 9, "beat_age_ms": 20.0, "step": 3}]})";
  fs::create_directories(incidents / "123456789012345678901234567890");
  const auto r = testing::run_brigade({"diagnose", dir.path().string()});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("incident 1 could not be read"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("incident 2: rank 0 (node 0) crashed"), std::string::npos) << r.out << r.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

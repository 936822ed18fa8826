// Issue 14's chaos run across nodes: scripts/chaos_nodes.sh (3 namespace
// nodes and a standby, every fault kind at a mean time between failures,
// the harness replacing every lost machine) run to its end, and its checks
// held: the job finished by itself, no corrupted checkpoint, one incident
// per generation a fault struck, of the kind raised, the ETTR measured and
// `brigade ettr` run against the failure model.
//
// It runs only when BRIGADE_CHAOS_NODES_S says how long to train (the
// step count is that over this model's ~0.2 s steps): 120 is the 2-minute
// form the issue asks of CI, 600 the long form; BRIGADE_CHAOS_NODES_MTBF_S
// (60 by default) and BRIGADE_CHAOS_NODES_SEED (1) vary it: every kind is
// drawn, but a 2-minute run at 60 s raises about 2 faults, so only the
// long form sees each kind strike, and must (seed 1: all four). The checks
// include the ETTR of at least 95% (BRIGADE_CHAOS_NODES_MIN_ETTR
// changes it) and the failure model within 3 points (..._MODEL_TOLERANCE).
// CI (scripts/test.sh) runs the 2-minute form with the ETTR floor at 0.70
// and the model within 6 points: the model assumes a fault a minute, and
// two faults in a minute of steps on a machine other tests load is not
// that; every other check is the long form's. Needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The model's step on 3 loaded cores (scripts/chaos_nodes.sh's config).
constexpr double kStepS = 0.2;

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

TEST(ElasticChaosNodes, ThreeNodesAndAStandbyRideOutChaosOfEveryKind) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  const char* seconds = std::getenv("BRIGADE_CHAOS_NODES_S");
  if (seconds == nullptr) {
    GTEST_SKIP() << "set BRIGADE_CHAOS_NODES_S=120 (the 2-minute form) or 600 (the long form)";
  }
  const int steps = static_cast<int>(std::atof(seconds) / kStepS);
  ASSERT_GT(steps, 10) << "BRIGADE_CHAOS_NODES_S=" << seconds;
  testing::TempDir dir("brigade_chaos_nodes");
  // Down whatever happens to the script: its namespaces (and the launchers
  // in them) never outlive the test.
  testing::Cluster cluster("brgcn", "10.88.42", dir.path());
  const fs::path out = dir.path() / "chaos";
  const fs::path log = dir.path() / "chaos.log";
  const std::string script = BRIGADE_SOURCE_DIR "/scripts/chaos_nodes.sh";
  // The script's own bound (2 s a step, plus 300 s) ends a hang; this one
  // only guards the script: SIGTERM, so its EXIT trap stops the launchers,
  // and SIGKILL only if that takes more than a minute.
  const auto limit = std::chrono::seconds(steps * 2 + 600);
  const bool long_form = std::atof(seconds) >= 600;
  const pid_t pid =
      testing::spawn({script, "--out", out.string(), "--steps", std::to_string(steps), "--mtbf",
                      env_or("BRIGADE_CHAOS_NODES_MTBF_S", "60"), "--seed",
                      env_or("BRIGADE_CHAOS_NODES_SEED", "1"), "--brigade", testing::kBrigade,
                      "--name", "brgcn", "--net", "10.88.42", "--port", "29562", "--min-ettr",
                      env_or("BRIGADE_CHAOS_NODES_MIN_ETTR", "0.95"), "--model-tolerance",
                      env_or("BRIGADE_CHAOS_NODES_MODEL_TOLERANCE", "0.03"),
                      // The short form's one or two faults come by
                      // chance: the model at the run's own fault rate.
                      "--model-mtbf", long_form ? "chaos" : "realized", "--require-kinds",
                      long_form ? "kill+stop+partition+kill-agent" : ""},
                     log);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "chaos_nodes.sh did not finish within " << limit.count() << " s";
      ::kill(pid, SIGTERM);
      const auto grace = std::chrono::steady_clock::now() + 60s;
      while (::waitpid(pid, &wait_status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > grace) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &wait_status, 0);
          break;
        }
        std::this_thread::sleep_for(100ms);
      }
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  const std::string output = testing::read_all(log);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << output;
  const std::string text = testing::read_all(out / "report.json");
  ASSERT_FALSE(text.empty()) << output;
  const nlohmann::json report = nlohmann::json::parse(text);
  EXPECT_TRUE(report.at("failures").empty()) << report.dump(1);
  EXPECT_GT(report.at("checkpoints_checked").get<int>(), 0) << report.dump(1);
  const double ettr = report.at("summary").at("ettr").get<double>();
  std::printf("chaos across nodes: ETTR %.1f%%, model %.1f%%, faults %s, incidents %s\n",
              100 * ettr, 100 * report.at("ettr_model").at("predicted_ettr").get<double>(),
              report.at("faults_raised").dump().c_str(), report.at("incidents").dump().c_str());
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

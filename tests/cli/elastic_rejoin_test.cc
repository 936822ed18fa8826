// Rejoining (scale up) end to end, every "node" a `brigade launch` on
// loopback: 2 nodes x 2 workers at dp 4, --nnodes 1:2; node 1's launcher
// kills itself after step 3 and node 0 goes on alone (dp 2, grad_accum 2),
// held after step 2 (hold:node=0) until the job stops for the rejoin; a
// fresh launcher started then with --standby joins, and the job grows back
// to dp 4 and finishes with the fault-free run's losses. The
// coordinator's decisions alone: tests/elastic/rejoin_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/free_port.h"
#include "testing/launchers.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int64_t kSteps = 30;
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
grad_accum = 1
steps = 30
seed = 5
checkpoint_every = 100
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
dp = 4
timeout_s = 30
)";

std::map<int64_t, double> losses(const fs::path& run) {
  std::map<int64_t, double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("loss") && row.contains("step")) {
      out[row.at("step").get<int64_t>()] = row.at("loss").get<double>();
    }
  }
  return out;
}

using testing::Launchers;
using testing::wait_for;

class ElasticRejoin : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(config_) << testing::kTinyModelToml << kTraining; }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  std::vector<std::string> args(const std::string& nnodes, const std::string& run,
                                const std::vector<std::string>& role) const {
    std::vector<std::string> a = {"launch",      "--nproc-per-node", "2",   "--nnodes",
                                  nnodes,        "--rdzv",           rdzv_, "--rdzv-token",
                                  "rejoin-test", "--rdzv-timeout-s", "60",  "--max-restarts",
                                  "1",           "--metrics",        "off"};
    a.insert(a.end(), role.begin(), role.end());
    a.insert(a.end(), {"--", "train", config_.string(), "--set",
                       "train.run_dir=\"" + (dir_.path() / run).string() + "\""});
    return a;
  }
  testing::TempDir dir_{"brigade_elastic_rejoin"};
  fs::path config_ = dir_.path() / "config.toml";
  std::string rdzv_ = "127.0.0.1:" + std::to_string(testing::free_port());
};

// Node 1 is lost after step 3; node 0 starts over alone (no periodic
// checkpoint) and is held after step 2 of generation 1, so that it is
// still training when the joiner has settled, however fast its steps; a
// fresh launcher with --standby then joins as node 1: every node stops at
// a step boundary and saves there (step 2 or 3), and generation 2 runs at dp 4
// again from that step to the end. Every loss is the fault-free run's, and incidents.jsonl
// holds the rejoin.
TEST_F(ElasticRejoin, AFreshLauncherJoinsAndTheJobGrowsBackToDpFour) {
  Launchers launchers(dir_.path());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  // The fault-free reference, on the same launchers.
  const pid_t ref0 = launchers.start("ref0", args("2", "reference", {"--node-rank", "0"}));
  const pid_t ref1 = launchers.start("ref1", args("2", "reference", {"--node-rank", "1"}));
  ASSERT_EQ(launchers.wait(ref0, deadline), 0) << launchers.err("ref0");
  ASSERT_EQ(launchers.wait(ref1, deadline), 0) << launchers.err("ref1");
  const std::map<int64_t, double> expected = losses(dir_.path() / "reference");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));

  rdzv_ = "127.0.0.1:" + std::to_string(testing::free_port());
  const std::vector<std::string> inject = {"--inject",
                                           "kill-agent:node=1:step=3,hold:node=0:step=2:gen=1"};
  std::vector<std::string> role0 = {"--node-rank", "0"}, role1 = {"--node-rank", "1"};
  role0.insert(role0.end(), inject.begin(), inject.end());
  role1.insert(role1.end(), inject.begin(), inject.end());
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  const pid_t node0 = launchers.start("node0", args("1:2", "grow", role0));
  const pid_t node1 = launchers.start("node1", args("1:2", "grow", role1));
  EXPECT_EQ(launchers.wait(node1, deadline), 128 + SIGKILL) << launchers.err("node1");
  ASSERT_TRUE(wait_for(
      [&] {
        return launchers.err("node0").find("node 0 runs as node 0 of 1 in generation 1") !=
               std::string::npos;
      },
      std::chrono::seconds(60)))
      << launchers.err("node0");
  // Generation 1 has completed step 2 and waits: the rejoin's stop finds
  // a step to save, whenever the joiner settles.
  ASSERT_TRUE(wait_for(
      [&] {
        return launchers.err("node0").find(
                   "holding node 0's workers after step 2 (generation "
                   "1) until the generation stops") != std::string::npos;
      },
      std::chrono::seconds(60)))
      << launchers.err("node0");
  const pid_t joiner = launchers.start("joiner", args("1:2", "grow", {"--standby"}));
  const int status0 = launchers.wait(node0, deadline);
  const int status_joiner = launchers.wait(joiner, deadline);
  ASSERT_EQ(status0, 0) << launchers.err("node0") << "\njoiner:\n" << launchers.err("joiner");
  EXPECT_EQ(status_joiner, 0) << launchers.err("joiner") << "\nnode 0:\n" << launchers.err("node0");
  EXPECT_NE(launchers.err("node0").find("node 1 rejoins: standby 0 takes its place from "
                                        "generation 2, the job grows back to 2 of its 2 nodes; "
                                        "no restart used; restarting the workers as generation 2 "
                                        "(a rejoin, no restart used)"),
            std::string::npos)
      << launchers.err("node0");
  EXPECT_NE(launchers.err("joiner").find("standby node 0 takes the place of node 1: starting its "
                                         "workers as generation 2"),
            std::string::npos)
      << launchers.err("joiner");

  // (A held rank may be reported as a straggler: not this test's.)
  const auto lines = testing::read_failures(dir_.path() / "grow" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 3u) << launchers.err("node0");
  EXPECT_EQ(lines[0].at("kind"), "node_lost") << lines[0].dump();
  const nlohmann::json& rejoin = lines[1];
  EXPECT_EQ(rejoin.at("kind"), "rejoin") << rejoin.dump();
  EXPECT_EQ(rejoin.at("restart"), false) << rejoin.dump();  // no failure
  EXPECT_EQ(rejoin.at("node"), 1) << rejoin.dump();
  EXPECT_EQ(rejoin.at("generation"), 1) << rejoin.dump();
  ASSERT_TRUE(rejoin.at("resumed_from_step").is_number_integer()) << rejoin.dump();
  const int64_t resumed = rejoin.at("resumed_from_step");
  // No periodic checkpoint: generation 1 started over, and generation 2
  // resumed from where node 0 saved for the rejoin: held after step 2 when
  // its SIGTERM came, its workers agree on the stop at the first agreement
  // after that (step 2's or step 3's, as the signal meets it).
  EXPECT_GE(resumed, 2) << rejoin.dump();
  EXPECT_LE(resumed, 3) << rejoin.dump();
  EXPECT_EQ(lines[2].at("kind"), "summary") << lines[2].dump();
  // The node lost is the one failure; the rejoin is counted apart.
  EXPECT_EQ(lines[2].at("incidents"), 1) << lines[2].dump();
  EXPECT_EQ(lines[2].at("rejoins"), 1) << lines[2].dump();
  EXPECT_EQ(lines[2].at("restarts"), 1) << lines[2].dump();

  const std::map<int64_t, double> got = losses(dir_.path() / "grow");
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << launchers.err("node0");
  for (const auto& [step, loss] : expected) {
    EXPECT_LE(std::abs(got.at(step) - loss), 1e-4 * std::abs(loss))
        << "step " << step << ": " << got.at(step) << " vs " << loss;
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// Restarts across nodes through the coordinator (elastic/coordinator.h),
// with every "node" a `brigade launch` on loopback: fast enough for the
// unit label. The same on network-namespace nodes, with training, a hang
// and a cut network, is tests/cli/elastic_nodes_cluster_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace {
namespace fs = std::filesystem;
using testing::Output;
using testing::run_brigade;

// Runs `brigade launch --nnodes 2` on both nodes at once, node by node's
// flags and command; returns each launcher's output.
std::vector<Output> launch_two_nodes(const std::vector<std::vector<std::string>>& flags,
                                     const std::vector<std::string>& command) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<Output> outputs(2);
  std::vector<std::thread> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> args = {
        "launch",      "--nproc-per-node",   "2",      "--nnodes", "2",
        "--node-rank", std::to_string(node), "--rdzv", rdzv,       "--rdzv-token",
        "nodes-test",  "--rdzv-timeout-s",   "60"};
    args.insert(args.end(), flags[node].begin(), flags[node].end());
    args.push_back("--");
    args.insert(args.end(), command.begin(), command.end());
    nodes.emplace_back(
        [&outputs, node, args] { outputs[node] = run_brigade(args, std::chrono::seconds(120)); });
  }
  for (std::thread& t : nodes) t.join();
  return outputs;
}

class ElasticNodes : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  testing::TempDir dir_{"brigade_elastic_nodes"};
};

// Rank 3 (node 1) fails in generation 0: both nodes' workers stop, and both
// start again as generation 1, which succeeds everywhere.
TEST_F(ElasticNodes, AFailureOnOneNodeRestartsEveryNodeAsTheNextGeneration) {
  const std::string out = dir_.path().string();
  const std::string script =
      "if [ $BRIGADE_GENERATION = 0 ] && [ $RANK = 3 ]; then exit 3; fi; "
      "if [ $BRIGADE_GENERATION = 0 ]; then exec sleep 60; fi; "
      "echo $BRIGADE_GENERATION > " +
      out + "/done.$RANK";
  const auto r =
      launch_two_nodes({{"--max-restarts", "1"}, {"--max-restarts", "1"}}, {"sh", "-c", script});
  EXPECT_EQ(r[0].status, 0) << "node 0:\n" << r[0].err << "\nnode 1:\n" << r[1].err;
  EXPECT_EQ(r[1].status, 0) << "node 1:\n" << r[1].err << "\nnode 0:\n" << r[0].err;
  EXPECT_NE(r[0].err.find("brigade launch: node 1: worker rank 3 (local 1, node 1) exited with "
                          "status 3; restarting the workers as generation 1 (restart 1 of 1)"),
            std::string::npos)
      << r[0].err;
  EXPECT_NE(r[1].err.find("brigade launch: worker rank 3 (local 1, node 1) exited with status 3; "
                          "restarting the workers as generation 1 (restart 1 of 1)"),
            std::string::npos)
      << r[1].err;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string generation;
    std::getline(in, generation);
    EXPECT_EQ(generation, "1") << "rank " << rank;
  }
}

// Restarts are the job's: the second failure, on the other node, finds none
// left, and both launchers end naming it.
TEST_F(ElasticNodes, RestartsAreCountedForTheWholeJob) {
  const std::string script =
      "if [ $BRIGADE_GENERATION = 0 ] && [ $RANK = 3 ]; then exit 3; fi; "
      "if [ $BRIGADE_GENERATION = 1 ] && [ $RANK = 0 ]; then exit 4; fi; "
      "exec sleep 60";
  const auto r =
      launch_two_nodes({{"--max-restarts", "1"}, {"--max-restarts", "1"}}, {"sh", "-c", script});
  EXPECT_EQ(r[0].status, 1) << r[0].err;
  EXPECT_EQ(r[1].status, 1) << r[1].err;
  EXPECT_NE(r[0].err.find("brigade launch: worker rank 0 (local 0, node 0) exited with status 4 "
                          "(after 1 restart); stopped the other 1 worker"),
            std::string::npos)
      << r[0].err;
  EXPECT_NE(r[1].err.find("brigade launch: stopped 2 workers on node 1: worker rank 0 (local 0, "
                          "node 0) exited with status 4 (no restart left: 1 used)"),
            std::string::npos)
      << r[1].err;
}

// Whichever launcher compares first refuses; the other may then find the
// store gone with it. Neither starts a worker.
TEST_F(ElasticNodes, NodesGivenDifferentRestartLimitsAreRefused) {
  const fs::path started = dir_.path() / "started";
  const auto r = launch_two_nodes({{"--max-restarts", "1"}, {"--max-restarts", "2"}},
                                  {"touch", started.string()});
  EXPECT_EQ(r[0].status, 1) << r[0].err;
  EXPECT_EQ(r[1].status, 1) << r[1].err;
  EXPECT_NE((r[0].err + r[1].err)
                .find("give every node the same --max-restarts (restarts are counted for the "
                      "whole job)"),
            std::string::npos)
      << r[0].err << r[1].err;
  EXPECT_FALSE(fs::exists(started));
}

}  // namespace
}  // namespace brigade

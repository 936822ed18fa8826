// Restarts across nodes through the coordinator (elastic/coordinator.h),
// with every "node" a `brigade launch` on loopback: fast enough for the
// unit label. The same on network-namespace nodes, with training, a hang
// and a cut network, is tests/cli/elastic_nodes_cluster_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
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
namespace BRIGADE_TEST_FILE {
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
      "if [ $BRIGADE_GENERATION = 0 ]; then exec sleep 100; fi; "
      "echo $BRIGADE_GENERATION > " +
      out + "/done.$RANK";
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      launch_two_nodes({{"--max-restarts", "1"}, {"--max-restarts", "1"}}, {"sh", "-c", script});
  // Node 0's sleepers were stopped for node 1's failure, not waited for
  // (a second on an idle machine; the bound leaves room for a loaded one).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
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

// Ctrl-C of one launcher stops the whole job: its own workers get the
// signal, the other node's agent hears of it through the coordinator and
// stops its workers too, and nobody restarts (restarts were left). Every
// node's workers get the signal's grace, not the failure's (1 s here):
// the interrupt checkpoint is collective.
TEST_F(ElasticNodes, CtrlCOfOneLauncherStopsEveryNodeWithoutARestart) {
  const std::string out = dir_.path().string();
  const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
  // Each worker says it runs (renamed into place, so a reader never sees
  // half a file), then sleeps; stopped, it "saves" for 3 s, longer than the
  // failure grace, far shorter than the signal's 30 s.
  // (The background sleep ignores SIGINT, as sh starts it: the trap ends it.)
  const std::string script = "trap 'kill $!; sleep 3; touch " + out +
                             "/saved.$RANK; exit 0' INT TERM; echo $BRIGADE_GENERATION > " + out +
                             "/tmp.$RANK && mv " + out + "/tmp.$RANK " + out +
                             "/running.$RANK || exit 1; sleep 60 & wait";
  std::vector<pid_t> launchers;
  std::fflush(nullptr);
  for (int node = 0; node < 2; ++node) {
    const std::string err = out + "/node" + std::to_string(node) + ".err";
    const std::string rank = std::to_string(node);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(126);
      ::execl(testing::kBrigade, testing::kBrigade, "launch", "--nproc-per-node", "2", "--nnodes",
              "2", "--node-rank", rank.c_str(), "--rdzv", rdzv.c_str(), "--rdzv-token",
              "nodes-test", "--max-restarts", "3", "--grace-period-s", "1", "--", "sh", "-c",
              script.c_str(), nullptr);
      ::_exit(127);
    }
    launchers.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto all_running = [&] {
    for (int rank = 0; rank < 4; ++rank) {
      if (!fs::exists(dir_.path() / ("running." + std::to_string(rank)))) return false;
    }
    return true;
  };
  while (!all_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(all_running()) << "the workers did not all start";
  ::kill(launchers[1], SIGINT);
  std::vector<int> statuses;
  for (const pid_t pid : launchers) {
    int wait_status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(pid, &wait_status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wait_status, 0);
      ADD_FAILURE() << "launcher " << pid << " did not stop";
    }
    statuses.push_back(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                              : 128 + WTERMSIG(wait_status));
  }
  auto text = [&](int node) {
    std::ifstream in(dir_.path() / ("node" + std::to_string(node) + ".err"));
    return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  };
  EXPECT_EQ(statuses[1], 128 + SIGINT) << text(1);
  EXPECT_EQ(statuses[0], 1) << text(0);
  EXPECT_NE(text(1).find("brigade launch: received SIGINT; stopped 2 workers"), std::string::npos)
      << text(1);
  EXPECT_NE(text(0).find("brigade launch: stopped 2 workers on node 0: the launcher of node 1 "
                         "received SIGINT"),
            std::string::npos)
      << text(0);
  EXPECT_EQ(text(0).find("restarting"), std::string::npos) << text(0);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(fs::exists(dir_.path() / ("saved." + std::to_string(rank))))
        << "rank " << rank << " was killed before it saved\n"
        << text(0) << text(1);
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

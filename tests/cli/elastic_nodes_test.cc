// Restarts across nodes through the coordinator (elastic/coordinator.h),
// with every "node" a `brigade launch` on loopback: fast enough for the
// unit label. The same on network-namespace nodes, with training, a hang
// and a cut network, is tests/cli/elastic_nodes_cluster_test.cc.
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/free_port.h"
#include "testing/launchers.h"
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

using testing::Launchers;
using testing::wait_for;

// Node 1's whole launcher SIGKILLed in generation 0 (its workers die with
// it): with a standby waiting, node 0 does not end the job; the standby
// runs node 1's ranks (2 and 3, GROUP_RANK and BRIGADE_NODE 1) in generation 1 and the job
// succeeds. Without one, node 0 ends the job naming node 1.
class ElasticStandby : public ElasticNodes {
 protected:
  // Generation 0: each worker writes its pid and sleeps; generation 1 says
  // who it is and exits 0.
  std::string script() const {
    const std::string out = dir_.path().string();
    return "if [ $BRIGADE_GENERATION = 0 ]; then echo $$ > " + out + "/tmp.$RANK && mv " + out +
           "/tmp.$RANK " + out + "/running.$RANK && " + gen0_ + "; fi; " + gen1_ + "echo " +
           "$BRIGADE_GENERATION $GROUP_RANK $RANK $BRIGADE_NODE > " + out + "/done.$RANK";
  }
  std::vector<std::string> args(const std::vector<std::string>& role) const {
    std::vector<std::string> a = {"launch",
                                  "--nproc-per-node",
                                  "2",
                                  "--nnodes",
                                  "2",
                                  "--rdzv",
                                  rdzv_,
                                  "--rdzv-token",
                                  "standby-test",
                                  "--rdzv-timeout-s",
                                  "60",
                                  "--max-restarts",
                                  "1"};
    a.insert(a.end(), role.begin(), role.end());
    a.insert(a.end(), {"--", "sh", "-c", script()});
    return a;
  }
  std::vector<pid_t> running_pids() const {
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 4; ++rank) {
      std::ifstream in(dir_.path() / ("running." + std::to_string(rank)));
      pid_t pid = 0;
      if (in >> pid) pids.push_back(pid);
    }
    return pids;
  }
  std::string rdzv_ = "127.0.0.1:" + std::to_string(testing::free_port());
  std::string gen0_ = "exec sleep 100";  // what generation 0's workers do once running
  std::string gen1_;                     // what generation 1's workers do first
};

TEST_F(ElasticStandby, AStandbyTakesTheRankOfANodeWhoseLauncherWasKilled) {
  Launchers launchers(dir_.path());
  const pid_t node0 = launchers.start("node0", args({"--node-rank", "0"}));
  const pid_t node1 = launchers.start("node1", args({"--node-rank", "1"}));
  const pid_t standby = launchers.start("standby", args({"--standby"}));
  ASSERT_TRUE(wait_for([&] { return running_pids().size() == 4; }, std::chrono::seconds(60)))
      << launchers.err("node0") << launchers.err("node1");
  ASSERT_TRUE(wait_for(
      [&] { return launchers.err("standby").find("waits to take the place") != std::string::npos; },
      std::chrono::seconds(60)))
      << launchers.err("standby");
  const std::vector<pid_t> generation0 = running_pids();
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(node1, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EXPECT_EQ(launchers.wait(node1, deadline), 128 + SIGKILL);
  // Node 1's workers do not outlive their launcher.
  for (const pid_t pid : {generation0[2], generation0[3]}) {
    EXPECT_TRUE(wait_for([&] { return ::kill(pid, 0) != 0; }, std::chrono::seconds(10)))
        << "worker " << pid << " outlived its launcher";
  }
  const int status0 = launchers.wait(node0, deadline);
  const double ended_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const int status_standby = launchers.wait(standby, deadline);
  EXPECT_EQ(status0, 0) << launchers.err("node0") << "\nstandby:\n" << launchers.err("standby");
  EXPECT_EQ(status_standby, 0) << launchers.err("standby") << "\nnode 0:\n"
                               << launchers.err("node0");
  // 2 s of silence, then a restart of sleepers: far below the 60 s the
  // rendezvous would wait, with room for a loaded machine.
  EXPECT_LT(ended_s, 30.0);
  EXPECT_NE(launchers.err("node0").find("node 1 is lost: its agent sent no heartbeat for"),
            std::string::npos)
      << launchers.err("node0");
  EXPECT_NE(launchers.err("node0").find("standby 0 takes its place as node 1 in generation 1; "
                                        "restarting the workers as generation 1 (restart 1 of 1)"),
            std::string::npos)
      << launchers.err("node0");
  EXPECT_NE(launchers.err("standby").find("standby node 0 takes the place of node 1: starting its "
                                          "workers as generation 1"),
            std::string::npos)
      << launchers.err("standby");
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "1 " + std::to_string(rank / 2) + " " + std::to_string(rank) + " " +
                        std::to_string(rank / 2))
        << "rank " << rank;
  }
}

// Node 1's launcher stopped (SIGSTOP: hung) in generation 0, its workers
// still running: the standby takes node 1's rank. Continued while
// generation 1 runs, node 1's old agent finds itself lost, stops its
// generation-0 workers and leaves without disturbing generation 1, which
// then completes.
TEST_F(ElasticStandby, AHungNodeIsReplacedAndItsAgentCannotComeBack) {
  const std::string out = dir_.path().string();
  gen1_ = "while [ ! -f " + out + "/release ]; do sleep 0.05; done; ";
  // Generation 0's workers note a SIGTERM and go on: node 1's, whose agent
  // was declared lost, must get SIGKILL at once (no grace in which to
  // write the run directory the standby now uses).
  gen0_ = "trap 'touch " + out + "/termed.$RANK' TERM; while true; do sleep 0.05; done";
  Launchers launchers(dir_.path());
  const pid_t node0 = launchers.start("node0", args({"--node-rank", "0"}));
  const pid_t node1 = launchers.start("node1", args({"--node-rank", "1"}));
  const pid_t standby = launchers.start("standby", args({"--standby"}));
  ASSERT_TRUE(wait_for([&] { return running_pids().size() == 4; }, std::chrono::seconds(60)))
      << launchers.err("node0") << launchers.err("node1");
  ASSERT_TRUE(wait_for(
      [&] { return launchers.err("standby").find("waits to take the place") != std::string::npos; },
      std::chrono::seconds(60)));
  const std::vector<pid_t> generation0 = running_pids();
  ::kill(node1, SIGSTOP);
  const bool replaced = wait_for(
      [&] {
        return launchers.err("standby").find("takes the place of node 1") != std::string::npos;
      },
      std::chrono::seconds(60));
  ::kill(node1, SIGCONT);
  ASSERT_TRUE(replaced) << launchers.err("node0") << launchers.err("standby");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EXPECT_EQ(launchers.wait(node1, deadline), 1) << launchers.err("node1");
  EXPECT_NE(launchers.err("node1").find("the coordinator declared node 1 lost in generation 0"),
            std::string::npos)
      << launchers.err("node1");
  EXPECT_EQ(launchers.err("node1").find("restarting"), std::string::npos) << launchers.err("node1");
  for (const pid_t pid : {generation0[2], generation0[3]}) {
    EXPECT_TRUE(wait_for([&] { return ::kill(pid, 0) != 0; }, std::chrono::seconds(10)))
        << "node 1's worker " << pid << " outlived its agent";
  }
  EXPECT_FALSE(fs::exists(dir_.path() / "termed.2")) << "given a SIGTERM's grace";
  EXPECT_FALSE(fs::exists(dir_.path() / "termed.3")) << "given a SIGTERM's grace";
  std::ofstream(dir_.path() / "release").close();
  EXPECT_EQ(launchers.wait(node0, deadline), 0) << launchers.err("node0");
  EXPECT_EQ(launchers.wait(standby, deadline), 0) << launchers.err("standby");
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "1 " + std::to_string(rank / 2) + " " + std::to_string(rank) + " " +
                        std::to_string(rank / 2))
        << "rank " << rank;
  }
}

// A standby started before node 1 joined waits for the whole job (node 0's
// agent beats only once every node joined), then serves: node 1, started
// well after the 2 s the standby allows the leader's silence, is killed and
// the standby takes its place.
TEST_F(ElasticStandby, AStandbyStartedBeforeEveryNodeJoinedStillServes) {
  Launchers launchers(dir_.path());
  const pid_t node0 = launchers.start("node0", args({"--node-rank", "0"}));
  const pid_t standby = launchers.start("standby", args({"--standby"}));
  ASSERT_TRUE(wait_for(
      [&] {
        return launchers.err("standby").find("standby waits for the job's 2 nodes to join") !=
               std::string::npos;
      },
      std::chrono::seconds(60)))
      << launchers.err("standby") << launchers.err("node0");
  // The scenario itself, not a wait for an event: node 1 comes late, twice
  // the leader silence a standby allows.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const pid_t node1 = launchers.start("node1", args({"--node-rank", "1"}));
  ASSERT_TRUE(wait_for([&] { return running_pids().size() == 4; }, std::chrono::seconds(60)))
      << launchers.err("node0") << launchers.err("node1") << launchers.err("standby");
  ASSERT_TRUE(wait_for(
      [&] { return launchers.err("standby").find("waits to take the place") != std::string::npos; },
      std::chrono::seconds(60)))
      << launchers.err("standby");
  ::kill(node1, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EXPECT_EQ(launchers.wait(node1, deadline), 128 + SIGKILL);
  EXPECT_EQ(launchers.wait(node0, deadline), 0) << launchers.err("node0") << "\nstandby:\n"
                                                << launchers.err("standby");
  EXPECT_EQ(launchers.wait(standby, deadline), 0) << launchers.err("standby");
  EXPECT_NE(launchers.err("standby").find("takes the place of node 1"), std::string::npos)
      << launchers.err("standby");
}

// A job that needs no standby: every node's workers exit 0, and the
// waiting standby, released by node 0, exits 0 saying it was not needed.
TEST_F(ElasticStandby, AStandbyNotNeededIsReleasedAndExitsZero) {
  gen0_ = "while [ ! -f " + dir_.path().string() + "/release ]; do sleep 0.05; done; exit 0";
  Launchers launchers(dir_.path());
  const pid_t node0 = launchers.start("node0", args({"--node-rank", "0"}));
  const pid_t node1 = launchers.start("node1", args({"--node-rank", "1"}));
  const pid_t standby = launchers.start("standby", args({"--standby"}));
  ASSERT_TRUE(wait_for([&] { return running_pids().size() == 4; }, std::chrono::seconds(60)))
      << launchers.err("node0") << launchers.err("node1");
  ASSERT_TRUE(wait_for(
      [&] { return launchers.err("standby").find("waits to take the place") != std::string::npos; },
      std::chrono::seconds(60)))
      << launchers.err("standby");
  std::ofstream(dir_.path() / "release").close();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EXPECT_EQ(launchers.wait(node0, deadline), 0) << launchers.err("node0");
  EXPECT_EQ(launchers.wait(node1, deadline), 0) << launchers.err("node1");
  EXPECT_EQ(launchers.wait(standby, deadline), 0) << launchers.err("standby");
  EXPECT_NE(launchers.err("standby").find("the job is over; standby node 0 was not needed"),
            std::string::npos)
      << launchers.err("standby");
  EXPECT_EQ(launchers.err("node0").find("not every standby node said it is done"),
            std::string::npos)
      << launchers.err("node0");
}

TEST_F(ElasticStandby, WithNoStandbyALostNodeEndsTheJobNamingIt) {
  Launchers launchers(dir_.path());
  const pid_t node0 = launchers.start("node0", args({"--node-rank", "0"}));
  const pid_t node1 = launchers.start("node1", args({"--node-rank", "1"}));
  ASSERT_TRUE(wait_for([&] { return running_pids().size() == 4; }, std::chrono::seconds(60)))
      << launchers.err("node0") << launchers.err("node1");
  ::kill(node1, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EXPECT_EQ(launchers.wait(node1, deadline), 128 + SIGKILL);
  EXPECT_EQ(launchers.wait(node0, deadline), 1) << launchers.err("node0");
  EXPECT_NE(launchers.err("node0").find("node 1 is lost: its agent sent no heartbeat for"),
            std::string::npos)
      << launchers.err("node0");
  EXPECT_NE(launchers.err("node0").find(
                "with no standby node the job cannot go on at the same world size"),
            std::string::npos)
      << launchers.err("node0");
  EXPECT_EQ(launchers.err("node0").find("restarting"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_.path() / "done.0"));
}

// A standby is a spare for a job of 2 nodes or more, and holds no node rank
// of its own.
TEST_F(ElasticStandby, AStandbyOutsideAMultiNodeJobIsRefused) {
  auto r = run_brigade({"launch", "--nproc-per-node", "1", "--standby", "--", "true"},
                       std::chrono::seconds(30));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--standby waits to replace a lost node other than node 0"),
            std::string::npos)
      << r.err;
  r = run_brigade({"launch", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
                   "--standby", "--rdzv", rdzv_, "--", "true"},
                  std::chrono::seconds(30));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--node-rank excludes --standby"), std::string::npos) << r.err;
}

// Whole-node faults and standbys that cannot work are refused before the
// rendezvous: nobody listens at rdzv_, which a launcher that joined would
// wait for 60 s, twice the time each refusal is given.
TEST_F(ElasticStandby, NodeFaultsAndStandbysThatCannotWorkAreRefusedBeforeTheRendezvous) {
  const auto launch = [&](std::vector<std::string> flags) {
    std::vector<std::string> a = {
        "launch",       "--nproc-per-node", "1", "--rdzv", rdzv_, "--rdzv-token",
        "refused-test", "--rdzv-timeout-s", "60"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--", "true"});
    return run_brigade(a, std::chrono::seconds(30));
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--inject", "partition:node=1:step=1"}, "it needs --nnodes 2 or more"},
      {{"--nnodes", "2", "--node-rank", "1", "--node-id", "rack/7"},
       "the node id 'rack/7' cannot name a machine: give --node-id (or BRIGADE_NODE_ID) 1 to 128 "
       "characters without '/'"},
      {{"--nnodes", "2", "--node-rank", "1", "--inject", "kill-agent:node=0:step=1"},
       "strikes node 0, which hosts the rendezvous store and leads the job"},
      {{"--nnodes", "2", "--node-rank", "1", "--inject", "kill-agent:node=2:step=1"},
       "kill-agent:node=2 names no node of this job (--nnodes 2): strike node 1..1"},
      {{"--nnodes", "2", "--standby"}, "give every node and the standby --max-restarts 1 or more"},
      // A partition on loopback would cut every node of this machine
      // (refused before root is asked for, so for any user).
      {{"--nnodes", "2", "--node-rank", "1", "--inject", "partition:node=1:step=1"},
       "a loopback interface"},
  };
  for (const auto& [flags, message] : cases) {
    const Output r = launch(flags);
    EXPECT_EQ(r.status, 1) << message << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  // A real interface of the machine's own network namespace (this test's):
  // never taken down, not even as root.
  std::string iface;
  ifaddrs* head = nullptr;
  ASSERT_EQ(::getifaddrs(&head), 0);
  for (ifaddrs* a = head; a != nullptr && iface.empty(); a = a->ifa_next) {
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET &&
        (a->ifa_flags & IFF_LOOPBACK) == 0) {
      iface = a->ifa_name;
    }
  }
  ::freeifaddrs(head);
  if (!iface.empty()) {
    const Output r = launch({"--nnodes", "2", "--node-rank", "1", "--iface", iface, "--inject",
                             "partition:node=1:step=1"});
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find(::geteuid() == 0 ? "refusing the partition fault" : "needs root"),
              std::string::npos)
        << r.err;
  }
  // No agent to follow the coordinator under srun's one task per worker.
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);
  const Output r =
      run_brigade({"launch", "--nnodes", "2", "--standby", "--", "true"}, std::chrono::seconds(30));
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("SLURM_NTASKS");
  ::unsetenv("SLURM_STEP_ID");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("under srun's one task per worker there is none"), std::string::npos)
      << r.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// Restarts across nodes on network-namespace nodes (scripts/fake_cluster.sh):
// 2 nodes x 2 workers `brigade launch ... -- train` of the tiny model with a
// checkpoint every step. A worker of node 1 killed, or stopped with SIGSTOP,
// by an injected fault: both nodes stop, the coordinator opens generation 1
// for both, and the job ends bit-identical to a run without faults. Node 1's
// network cut: node 0 names the node within 3 s of its last heartbeat and
// ends the job, long before any collective timeout; cut just long enough
// for node 1's agent to give up, both nodes restart in place once the
// cable is back.
// Needs root; skipped otherwise. Every launcher is stopped by pid whatever
// happens (Started), then the cluster is brought down.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"
#include "testing/two_node_job.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::Cluster;
using testing::ClusterResult;
using testing::read_failures;
using testing::Started;
using namespace std::chrono_literals;

// A collective timeout far above the detection bounds, far below the test's:
// a failure the agents missed would surface as a late crash instead.
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 8
seed = 5
checkpoint_every = 1
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
dp = 4
timeout_s = 30
)";

class ElasticNodesCluster : public testing::TwoNodeJob {
 protected:
  ElasticNodesCluster() : TwoNodeJob("elastic_nodes", kTraining) {}

  // Both nodes of a job that trains on and on into run directory `run`,
  // once both are in training, with checkpoints (step 2's written): their
  // workers are in collectives. False, saying why, if they never got there.
  // `flags`: more of launch's flags; `train`: train's (by default steps
  // without end).
  bool start_training(Started& started, const std::string& run, int port, pid_t& node0,
                      pid_t& node1, const std::vector<std::string>& flags = {},
                      const std::vector<std::string>& train = {"--set", "train.steps=100000"}) {
    node1 = started.add(cluster_->start_on(1, launch(1, run, port, flags, train), log_of(run, 1)));
    node0 = started.add(cluster_->start_on(0, launch(0, run, port, flags, train), log_of(run, 0)));
    const fs::path second = dir_.path() / run / "checkpoints" / "step_00000002";
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (!fs::exists(second) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    if (fs::exists(second)) return true;
    ADD_FAILURE() << "no step 2 within 120 s:\n"
                  << testing::read_all(log_of(run, 0)) << testing::read_all(log_of(run, 1));
    return false;
  }

  std::string reference_hash() { return TwoNodeJob::reference_hash(29531); }

  // A fault injected on rank 3 (node 1) after step 4: recovered on both
  // nodes by themselves, and bit-identical to the run without faults.
  void expect_recovers(const std::string& fault, const char* kind, double detect_bound_ms) {
    const std::string reference = reference_hash();
    const auto r = run_job("faulty", 29532, {}, false, {"--inject", fault});
    const ClusterResult &r0 = r[0], &r1 = r[1];
    ASSERT_EQ(r0.status, 0) << r0.output << "\nnode 1:\n" << r1.output;
    ASSERT_EQ(r1.status, 0) << r1.output << "\nnode 0:\n" << r0.output;
    EXPECT_NE(r0.output.find("brigade launch: node 1: worker rank 3 (local 1, node 1"),
              std::string::npos)
        << r0.output;
    EXPECT_NE(r0.output.find("restarting the workers as generation 1 (restart 1 of 2)"),
              std::string::npos)
        << r0.output;
    EXPECT_NE(r1.output.find("restarting the workers as generation 1 (restart 1 of 2)"),
              std::string::npos)
        << r1.output;
    EXPECT_EQ(hash("faulty"), reference);
    // Node 0 writes the job's incidents: node 1's, with its detection time.
    const auto lines = read_failures(dir_.path() / "faulty" / "incidents.jsonl");
    ASSERT_EQ(lines.size(), 2u);
    const nlohmann::json& incident = lines[0];
    EXPECT_EQ(incident.at("kind"), kind) << incident;
    EXPECT_EQ(incident.at("node"), 1) << incident;
    EXPECT_EQ(incident.at("rank"), 3) << incident;
    EXPECT_EQ(incident.at("injected"), true) << incident;
    EXPECT_EQ(incident.at("generation"), 0) << incident;
    EXPECT_LE(incident.at("detected_after_ms").get<double>(), detect_bound_ms) << incident;
    EXPECT_FALSE(incident.at("recovered_after_ms").is_null()) << incident;
    EXPECT_EQ(lines[1].at("kind"), "summary");
    EXPECT_EQ(lines[1].at("restarts"), 1);
    EXPECT_FALSE(fs::exists(dir_.path() / "faulty" / "incidents.node1.jsonl"));
  }

  // 2 nodes and a standby (on namespace node 2); `fault` strikes node 1
  // after step 4 (launch --inject): the standby takes node 1's place, and
  // the job ends bit-identical to the run without faults. Node 1's
  // launcher's status is returned.
  int expect_standby_takes_over(const std::string& fault, const char* kind) {
    const std::string reference = reference_hash();
    const std::vector<std::string> flags = {"--inject", fault};
    const auto r = run_job("standby", 29534, {"--inject", fault}, true);
    const ClusterResult &r0 = r[0], &r1 = r[1], &r2 = r[2];
    EXPECT_EQ(r0.status, 0) << r0.output << "\nnode 1:\n"
                            << r1.output << "\nstandby:\n"
                            << r2.output;
    EXPECT_EQ(r2.status, 0) << r2.output << "\nnode 0:\n" << r0.output;
    EXPECT_NE(r1.output.find("brigade launch: injecting " + fault.substr(0, fault.find(':')) +
                             " on node 1 after step 4 (generation 0)"),
              std::string::npos)
        << r1.output;
    EXPECT_NE(r0.output.find("standby 0 takes its place as node 1 in generation 1; "
                             "restarting the workers as generation 1 (restart 1 of 2)"),
              std::string::npos)
        << r0.output;
    EXPECT_NE(r2.output.find("standby node 0 takes the place of node 1: starting its workers as "
                             "generation 1"),
              std::string::npos)
        << r2.output;
    EXPECT_EQ(hash("standby"), reference);
    const auto lines = read_failures(dir_.path() / "standby" / "incidents.jsonl");
    EXPECT_EQ(lines.size(), 2u);
    if (lines.size() == 2) {
      const nlohmann::json& incident = lines[0];
      EXPECT_EQ(incident.at("kind"), kind) << incident;
      EXPECT_EQ(incident.at("node"), 1) << incident;
      EXPECT_EQ(incident.at("injected"), true) << incident;
      EXPECT_EQ(incident.at("generation"), 0) << incident;
      // 2 s of silence, seen within the leader's next ticks (4 s: two
      // loaded cores).
      EXPECT_GE(incident.at("detected_after_ms").get<double>(), 2'000.0) << incident;
      EXPECT_LE(incident.at("detected_after_ms").get<double>(), 4'000.0) << incident;
      // Struck at step 4 (node 1's workers wait there for it), not steps
      // later: step 4's save has not started, step 3's may not have
      // committed when the fault strikes (step 2's had, or 3's could not
      // have started).
      EXPECT_GE(incident.at("resumed_from_step").get<int>(), 2) << incident;
      EXPECT_LE(incident.at("resumed_from_step").get<int>(), 4) << incident;
      EXPECT_FALSE(incident.at("recovered_after_ms").is_null()) << incident;
      EXPECT_EQ(lines[1].at("restarts"), 1);
    }
    return r1.status;
  }
};

TEST_F(ElasticNodesCluster, AWorkerKilledOnNodeOneRestartsBothNodesBitIdentical) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgek", "10.88.11");
  expect_recovers("kill:rank=3:step=4", "crash", 1'000);
}

TEST_F(ElasticNodesCluster, AWorkerStoppedOnNodeOneRestartsBothNodesBitIdentical) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brges", "10.88.12");
  // The watchdog's 2 s of silence, plus a loaded machine's margin.
  expect_recovers("stop:rank=3:step=4", "hang", 4'000);
}

// Node 1's cable pulled mid-training: node 0 ends the job naming node 1
// within 3 s of its last heartbeat (no 30 s collective timeout, no 60 s
// rendezvous timeout), and node 1 gives up on its own.
TEST_F(ElasticNodesCluster, ANodeCutOffTheNetworkIsNamedAndEndsTheJob) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgec", "10.88.13");
  const fs::path log0 = log_of("cut", 0), log1 = log_of("cut", 1);
  Started started;  // the ASSERTs below return early
  pid_t node0 = 0, node1 = 0;
  ASSERT_TRUE(start_training(started, "cut", 29533, node0, node1));
  ASSERT_EQ(cluster_->script({"cut", "1"}).status, 0);
  const auto cut_at = std::chrono::steady_clock::now();
  const ClusterResult r0 = started.finish(node0, log0, 60s);
  const double node0_ended_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  const ClusterResult r1 = started.finish(node1, log1, 60s);
  EXPECT_EQ(r0.status, 1) << r0.output;
  EXPECT_NE(r0.output.find("node 1 is lost: its agent sent no heartbeat for"), std::string::npos)
      << r0.output;
  EXPECT_NE(r0.output.find("with no standby node the job cannot go on at the same world size"),
            std::string::npos)
      << r0.output;
  // Detection (2 s of silence), then the workers' 5 s grace: far below any
  // timeout, with room for a loaded machine.
  EXPECT_LT(node0_ended_s, 20.0) << r0.output;
  EXPECT_NE(r1.status, 0) << r1.output;
  EXPECT_NE(r1.output.find("lost contact with the coordinator"), std::string::npos) << r1.output;
  const auto lines = read_failures(dir_.path() / "cut" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].at("kind"), "node_lost") << lines[0];
  EXPECT_EQ(lines[0].at("node"), 1) << lines[0];
  EXPECT_GE(lines[0].at("detected_after_ms").get<double>(), 2'000.0) << lines[0];
  EXPECT_LE(lines[0].at("detected_after_ms").get<double>(), 3'000.0) << lines[0];
}

// Node 1's cable pulled just long enough for its agent to give up on the
// store (a call's 1 s) and kill its workers, then put back before node 0's
// 2 s of silence: node 1 reports the store's loss as its own failure, and
// both nodes restart in place, bit-identical to the run without faults.
// Reporting its generation stopped without a failure, it would leave node
// 0's workers waiting in collectives with its killed ones until their 30 s
// timeout; leaving, the job would end (no standby).
TEST_F(ElasticNodesCluster, ANodeCutOffBrieflyRestartsInPlaceBitIdentical) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgeb", "10.88.14");
  const std::string reference = reference_hash();
  const fs::path log0 = log_of("blip", 0), log1 = log_of("blip", 1);
  Started started;  // the ASSERTs below return early
  pid_t node0 = 0, node1 = 0;
  // Node 1's workers wait after step 4 until the generation stops: the
  // job's 8 steps do not end before the cut, however short they are.
  ASSERT_TRUE(
      start_training(started, "blip", 29535, node0, node1, {"--inject", "hold:node=1:step=4"}, {}));
  // Node 1's workers (its processes but the launcher): the cable goes back
  // as soon as its agent gave up and killed them, watched without starting
  // a process per look (a loaded machine would see it late).
  const fs::path list = dir_.path() / "blip_pids.txt";
  const ClusterResult listed = testing::finish(
      testing::spawn({"/bin/sh", "-c", "ip netns pids " + cluster_->netns(1)}, list), list, 30s);
  std::vector<pid_t> workers;
  std::istringstream pids(listed.output);
  for (pid_t pid = 0; pids >> pid;) {
    if (pid != node1) workers.push_back(pid);
  }
  ASSERT_EQ(workers.size(), 2u) << "two workers besides the launcher: " << listed.output;
  auto all_gone = [&] {
    return std::none_of(workers.begin(), workers.end(),
                        [](pid_t pid) { return ::kill(pid, 0) == 0; });
  };
  ASSERT_EQ(cluster_->script({"cut", "1"}).status, 0);
  const auto cut_at = std::chrono::steady_clock::now();
  const auto deadline = cut_at + 20s;
  bool stopped = false;
  while (!(stopped = all_gone()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(cluster_->script({"heal", "1"}).status, 0);
  EXPECT_TRUE(stopped) << "node 1's agent did not stop its workers within 20 s of the cut";
  const double healed_after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  const ClusterResult r0 = started.finish(node0, log0, 120s);
  const ClusterResult r1 = started.finish(node1, log1, 60s);
  const std::string both = r0.output + "\nnode 1:\n" + r1.output +
                           fmt::format("\nhealed {:.2f} s after the cut", healed_after_s);
  ASSERT_EQ(r0.status, 0) << both;
  ASSERT_EQ(r1.status, 0) << both;
  EXPECT_NE(r1.output.find("node 1 lost the coordinator's store for"), std::string::npos) << both;
  EXPECT_NE(r1.output.find("it reached the store again: restarting in place"), std::string::npos)
      << both;
  for (const ClusterResult* r : {&r0, &r1}) {
    EXPECT_NE(r->output.find("restarting the workers as generation 1 (restart 1 of 2)"),
              std::string::npos)
        << both;
  }
  EXPECT_EQ(hash("blip"), reference);
  const auto lines = read_failures(dir_.path() / "blip" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u) << both;
  EXPECT_EQ(lines[0].at("kind"), "store_lost") << lines[0];
  EXPECT_EQ(lines[0].at("node"), 1) << lines[0];
  EXPECT_EQ(lines[0].at("generation"), 0) << lines[0];
  // A store call's 1 s, after the last one that answered (up to a tick
  // before the cut), on two loaded cores.
  EXPECT_GE(lines[0].at("detected_after_ms").get<double>(), 1'000.0) << lines[0];
  EXPECT_LE(lines[0].at("detected_after_ms").get<double>(), 3'000.0) << lines[0];
  EXPECT_FALSE(lines[0].at("recovered_after_ms").is_null()) << lines[0];
  EXPECT_EQ(lines[1].at("restarts"), 1);
}

// Node 1's launcher SIGKILLs its workers and itself after step 4: a
// standby node takes node 1's rank and the job ends as if nothing happened.
TEST_F(ElasticNodesCluster, ANodeWhoseAgentDiedIsReplacedByAStandbyBitIdentical) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgsk", "10.88.21", 3);
  EXPECT_EQ(expect_standby_takes_over("kill-agent:node=1:step=4", "node_lost"), 128 + SIGKILL);
}

// Node 1's launcher takes its own network interface down after step 4 (the
// cable pulled): the standby takes its place; node 1, cut off, gives up.
TEST_F(ElasticNodesCluster, ANodeCutOffTheNetworkIsReplacedByAStandbyBitIdentical) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgsp", "10.88.22", 3);
  EXPECT_NE(expect_standby_takes_over("partition:node=1:step=4", "partition"), 0);
  // Cut by its own agent, from inside the node.
  const fs::path log = dir_.path() / "link.log";
  const ClusterResult link = testing::finish(
      testing::spawn({"/bin/sh", "-c", "ip -n " + cluster_->netns(1) + " link show eth0"}, log),
      log, 30s);
  EXPECT_NE(link.output.find("state DOWN"), std::string::npos) << link.output;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

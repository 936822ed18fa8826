// The etcd leader cut off the network while it lives: three namespace
// nodes (scripts/fake_cluster.sh) of one `brigade train` worker each, the
// coordinator's state in a real etcd on the bridge's address. Node 0, the
// leader, loses its cable mid-training; node 1 takes the leader key once
// node 0's lease ran out, declares it lost and, with --nnodes 2:3, goes on
// with nodes 1 and 2 from the newest checkpoint, while node 0's agent,
// alive but unable to reach etcd, stops its workers and leaves by itself.
// The killed leader is tests/cli/etcd_leader_external_test.cc. Needs root
// and etcd; skipped, saying so, otherwise.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "brigade/elastic/etcd_store.h"
#include "testing/etcd_leader_job.h"
#include "testing/etcd_server.h"
#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::ClusterResult;
using testing::read_failures;
using testing::Started;
using namespace std::chrono_literals;
constexpr char kToken[] = "etcd-leader-cluster-token";
constexpr char kNet[] = "10.88.31";

TEST(EtcdLeaderCluster, ALeaderCutOffIsReplacedAndLeavesByItself) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
  testing::TempDir dir("brigade_etcd_leader_cluster");
  testing::Cluster cluster("brgel", kNet, dir.path());
  const ClusterResult up = cluster.script({"up", "3"});
  ASSERT_EQ(up.status, 0) << up.output;
  // etcd on the bridge, which every node reaches (and node 0 no longer
  // once cut).
  testing::EtcdServer etcd(/*auth=*/true, std::string(kNet) + ".1");
  ASSERT_TRUE(etcd.ok());
  ASSERT_TRUE(etcd.add_job(elastic::etcd_user(kToken), kToken, elastic::etcd_prefix(kToken)));
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << testing::kEtcdLeaderTraining;
  const fs::path run = dir.path() / "run";
  Started started;  // the ASSERTs below return early
  std::vector<pid_t> pids(3);
  std::vector<fs::path> logs(3);
  for (const int node : {2, 1, 0}) {
    logs[node] = dir.path() / ("node" + std::to_string(node) + ".log");
    pids[node] = started.add(cluster.start_on(
        node,
        {testing::kBrigade, "launch", "--nproc-per-node", "1", "--nnodes", "2:3", "--node-rank",
         std::to_string(node), "--rdzv", cluster.address(0) + ":29571", "--rdzv-token", kToken,
         "--rdzv-timeout-s", "60", "--rdzv-backend", "etcd", "--rdzv-endpoints", etcd.url(),
         "--max-restarts", "1",
         // Generation 0 runs until the cut, however short its steps.
         "--inject", "hold:node=0:step=4", "--", "train", config.string(), "--set",
         "train.run_dir=\"" + run.string() + "\""},
        logs[node]));
  }
  const fs::path second = run / "checkpoints" / "step_00000002";
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!fs::exists(second) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(fs::exists(second)) << "no step 2 within 120 s:\n"
                                  << testing::read_all(logs[0]) << testing::read_all(logs[1]);
  ASSERT_EQ(cluster.script({"cut", "0"}).status, 0);
  const ClusterResult r1 = started.finish(pids[1], logs[1], 150s);
  const ClusterResult r2 = started.finish(pids[2], logs[2], 60s);
  const ClusterResult r0 = started.finish(pids[0], logs[0], 60s);
  const std::string all =
      "node 0:\n" + r0.output + "\nnode 1:\n" + r1.output + "\nnode 2:\n" + r2.output;
  ASSERT_EQ(r1.status, 0) << all;
  ASSERT_EQ(r2.status, 0) << all;
  EXPECT_NE(r1.output.find("node 1 runs as node 0 of 2 in generation 1 (the job started with 3 "
                           "nodes)"),
            std::string::npos)
      << all;
  // Node 0 could not reach etcd again within its 4 s: it left, writing
  // nothing, and did not restart.
  EXPECT_EQ(r0.status, 1) << all;
  EXPECT_NE(r0.output.find("lost contact with the coordinator's store at etcd"), std::string::npos)
      << all;
  EXPECT_EQ(r0.output.find("restarting"), std::string::npos) << all;
  // Nor did it try to release standbys it does not lead any more.
  EXPECT_EQ(r0.output.find("could not release the standby nodes"), std::string::npos) << all;
  // Node 1, the leader now, wrote the job's incidents: node 0 lost, by
  // silence (its agent never said it cut itself).
  const auto lines = read_failures(run / "incidents.jsonl");
  ASSERT_GE(lines.size(), 2u) << all;
  const nlohmann::json& incident = lines.front();
  EXPECT_EQ(incident.at("kind"), "node_lost") << incident.dump();
  EXPECT_EQ(incident.at("node"), 0) << incident.dump();
  EXPECT_EQ(incident.value("nodes", 0), 2) << incident.dump();
  // Scope 2: a node's loss of the network known within 3 s, the leader's
  // too (its silence past 2 s and its lease's expiry, at the takeover).
  EXPECT_GE(incident.at("detected_after_ms").get<double>(), 2'000) << incident.dump();
  EXPECT_LE(incident.at("detected_after_ms").get<double>(), 3'000) << incident.dump();
  EXPECT_EQ(lines.back().at("kind"), "summary") << lines.back().dump();
  // Every step was trained: the last checkpoint is step 8's.
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000008")) << all;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

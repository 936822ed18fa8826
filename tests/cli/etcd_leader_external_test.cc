// `brigade launch --rdzv-backend etcd` surviving the loss of node 0, the
// leader: three loopback nodes of one `brigade train` worker each, node 0's
// launcher killed with its worker after step 4 (--inject kill-agent). Node
// 1's agent takes the leader key once node 0's lease ran out, declares node
// 0 lost and, with --nnodes 2:3, goes on with nodes 1 and 2 from the newest
// checkpoint (dp 3 x grad_accum 2 -> dp 2 x grad_accum 3), their workers
// meeting in node 1's own store: node 0's went with it. A real etcd the test starts
// (tests/testing/etcd_server.h); skipped, saying so, without etcd. The
// election alone: tests/elastic/etcd_election_external_test.cc. The new
// leader marks the run's trace (diag/trace_incidents.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "brigade/elastic/etcd_store.h"
#include "testing/etcd_leader_job.h"
#include "testing/etcd_server.h"
#include "testing/free_port.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::Output;
using testing::read_failures;
using testing::run_brigade;
constexpr char kToken[] = "etcd-leader-test-token";

class EtcdLeader : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
    etcd_ = std::make_unique<testing::EtcdServer>();
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->add_job(elastic::etcd_user(kToken), kToken, elastic::etcd_prefix(kToken)));
    std::ofstream(config_) << testing::kTinyModelToml << testing::kEtcdLeaderTraining;
  }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  std::unique_ptr<testing::EtcdServer> etcd_;
  testing::TempDir dir_{"brigade_etcd_leader"};
  fs::path config_ = dir_.path() / "config.toml";
};

TEST_F(EtcdLeader, NodeZerosLossLeavesTheJobToNodeOneThroughEtcd) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
  const fs::path run = dir_.path() / "run";
  std::vector<Output> r(3);
  std::vector<std::thread> nodes;
  for (int node = 0; node < 3; ++node) {
    const std::vector<std::string> args = {"launch",
                                           "--nproc-per-node",
                                           "1",
                                           "--nnodes",
                                           "2:3",
                                           "--node-rank",
                                           std::to_string(node),
                                           "--rdzv",
                                           rdzv,
                                           "--rdzv-token",
                                           kToken,
                                           "--rdzv-timeout-s",
                                           "60",
                                           "--rdzv-backend",
                                           "etcd",
                                           "--rdzv-endpoints",
                                           etcd_->url(),
                                           "--max-restarts",
                                           "1",
                                           "--inject",
                                           "kill-agent:node=0:step=4",
                                           "--",
                                           "train",
                                           config_.string(),
                                           "--set",
                                           "train.run_dir=\"" + run.string() + "\"",
                                           "--trace",
                                           "3"};
    nodes.emplace_back(
        [&r, node, args] { r[node] = run_brigade(args, std::chrono::seconds(150)); });
  }
  for (std::thread& t : nodes) t.join();
  EXPECT_EQ(r[0].status, 128 + SIGKILL) << r[0].err;
  ASSERT_EQ(r[1].status, 0) << "node 1:\n" << r[1].err << "\nnode 0:\n" << r[0].err;
  ASSERT_EQ(r[2].status, 0) << "node 2:\n" << r[2].err << "\nnode 1:\n" << r[1].err;
  EXPECT_NE(r[1].err.find("node 1 runs as node 0 of 2 in generation 1 (the job started with 3 "
                          "nodes)"),
            std::string::npos)
      << r[1].err;
  EXPECT_NE(r[2].err.find("node 2 runs as node 1 of 2 in generation 1"), std::string::npos)
      << r[2].err;
  // Node 1, the leader now, wrote the job's incidents: node 0 lost.
  const auto lines = read_failures(run / "incidents.jsonl");
  ASSERT_GE(lines.size(), 2u) << r[1].err;
  const nlohmann::json& incident = lines.front();
  EXPECT_EQ(incident.at("kind"), "node_lost") << incident.dump();
  EXPECT_EQ(incident.at("node"), 0) << incident.dump();
  EXPECT_EQ(incident.value("nodes", 0), 2) << incident.dump();
  EXPECT_NE(incident.at("what").get<std::string>().find("node 0 is lost"), std::string::npos)
      << incident.dump();
  EXPECT_EQ(lines.back().at("kind"), "summary") << lines.back().dump();
  // The new leader marked the loss in the trace of the generation that
  // recovered from it (node 0, the leader that was, marks nothing: killed),
  // once the job ended on both nodes left.
  std::ifstream in(run / "trace.gen1.json");
  ASSERT_TRUE(in.good()) << r[1].err;
  const nlohmann::json trace = nlohmann::json::parse(in);
  int lost = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    lost += e.value("cat", "") == "incident" && e.at("ph") == "i" &&
            e.at("args").value("kind", "") == "node_lost";
  }
  EXPECT_EQ(lost, 1) << r[1].err;
  EXPECT_EQ(r[1].err.find("could not mark"), std::string::npos) << r[1].err;
  // Every step was trained: the last checkpoint is step 8's.
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000008")) << r[1].err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

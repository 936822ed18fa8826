// Going on with fewer nodes (`brigade launch --nnodes MIN:MAX`), every
// "node" a `brigade launch` on loopback: node 1's launcher killed with no
// standby, node 0 goes on alone on the same global batch (dp 4 x
// grad_accum 1 -> dp 2 x grad_accum 2), its losses those of the run without
// a fault; a 3-node job renumbers node 2 as node 1; and the node counts a
// job could not go on with are refused before any rendezvous. The
// coordinator's decision alone: tests/elastic/fewer_nodes_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

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

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
grad_accum = 1
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

std::string file_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class ElasticFewer : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(config_) << testing::kTinyModelToml << kTraining; }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  // Every node's `brigade launch --nnodes nnodes` at once (run_brigade
  // kills each past its timeout, by pid); node by node's output.
  // Nodes past 0 are given `others_nnodes` when set.
  std::vector<Output> launch(int nodes, const std::string& nnodes, int nproc,
                             const std::vector<std::string>& flags,
                             const std::vector<std::string>& command,
                             const std::string& others_nnodes = "") {
    const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
    std::vector<Output> outputs(static_cast<size_t>(nodes));
    std::vector<std::thread> threads;
    for (int node = 0; node < nodes; ++node) {
      std::vector<std::string> args = {"launch",
                                       "--nproc-per-node",
                                       std::to_string(nproc),
                                       "--nnodes",
                                       node > 0 && !others_nnodes.empty() ? others_nnodes : nnodes,
                                       "--node-rank",
                                       std::to_string(node),
                                       "--rdzv",
                                       rdzv,
                                       "--rdzv-token",
                                       "fewer-test",
                                       "--rdzv-timeout-s",
                                       "60",
                                       "--max-restarts",
                                       "1"};
      args.insert(args.end(), flags.begin(), flags.end());
      args.push_back("--");
      args.insert(args.end(), command.begin(), command.end());
      threads.emplace_back([&outputs, node, args] {
        outputs[static_cast<size_t>(node)] = run_brigade(args, std::chrono::seconds(120));
      });
    }
    for (std::thread& t : threads) t.join();
    return outputs;
  }
  // The fault-free run's losses (2 nodes x 2 workers, dp 4), run once per
  // test binary: every test here trains the same config.
  std::map<int64_t, double> reference_losses() {
    static std::map<int64_t, double> cached;
    if (!cached.empty()) return cached;
    const auto ref = launch(2, "2", 2, {}, train("reference"));
    EXPECT_EQ(ref[0].status, 0) << ref[0].err;
    EXPECT_EQ(ref[1].status, 0) << ref[1].err;
    cached = losses(dir_.path() / "reference");
    return cached;
  }
  std::vector<std::string> train(const std::string& run) const {
    return {"train", config_.string(), "--set",
            "train.run_dir=\"" + (dir_.path() / run).string() + "\""};
  }
  testing::TempDir dir_{"brigade_elastic_fewer"};
  fs::path config_ = dir_.path() / "config.toml";
};

// 2 nodes x 2 workers, --nnodes 1:2: node 1's launcher kills itself and its
// workers after step 4. Node 0 goes on alone as dp 2 with grad_accum 2 from
// the newest checkpoint, and every loss after the resume is the fault-free
// run's at the same step (the same samples, summed in another order: rank r
// of dp 2 takes the samples of ranks 2r and 2r+1 of dp 4).
TEST_F(ElasticFewer, NodeZeroGoesOnAloneOnTheSameGlobalBatch) {
  const std::map<int64_t, double> expected = reference_losses();
  const auto r = launch(2, "1:2", 2, {"--inject", "kill-agent:node=1:step=4"}, train("fewer"));
  EXPECT_EQ(r[1].status, 128 + SIGKILL) << r[1].err;
  ASSERT_EQ(r[0].status, 0) << r[0].err << "\nnode 1:\n" << r[1].err;
  EXPECT_NE(r[0].err.find("node 0 runs as node 0 of 1 in generation 1 (the job started with 2 "
                          "nodes)"),
            std::string::npos)
      << r[0].err;
  const auto lines = read_failures(dir_.path() / "fewer" / "incidents.jsonl");
  ASSERT_GE(lines.size(), 2u) << r[0].err;
  const nlohmann::json& incident = lines.front();
  ASSERT_TRUE(incident.at("resumed_from_step").is_number_integer()) << incident.dump();
  const int64_t resumed = incident.at("resumed_from_step");
  const std::map<int64_t, double> got = losses(dir_.path() / "fewer");
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(got.rbegin()->first, 8) << r[0].err;
  // Every step after the resume ran on node 0 alone (steps after the
  // checkpoint it resumed from, which node 1's fault at step 4 may precede).
  EXPECT_LE(resumed, 4);
  for (int64_t step = resumed + 1; step <= 8; ++step) {
    ASSERT_TRUE(got.contains(step)) << step;
    EXPECT_LE(std::abs(got.at(step) - expected.at(step)), 1e-4 * std::abs(expected.at(step)))
        << "step " << step << ": " << got.at(step) << " vs " << expected.at(step);
  }
  EXPECT_EQ(incident.at("kind"), "node_lost") << incident.dump();
  EXPECT_EQ(incident.at("node"), 1);
  EXPECT_EQ(incident.value("nodes", 0), 1) << incident.dump();
  EXPECT_NE(incident.at("what").get<std::string>().find("the job goes on with 1 of its 2 nodes"),
            std::string::npos)
      << incident.dump();
  EXPECT_EQ(lines.back().at("kind"), "summary") << lines.back().dump();
  EXPECT_EQ(lines.back().at("incidents"), 1) << lines.back().dump();
}

// The same with no checkpoint before the fault: node 0 starts over alone,
// still with dp 2 x grad_accum 2 (the agent's --set without --resume), and
// every loss is the fault-free run's.
TEST_F(ElasticFewer, NodeZeroStartingOverAloneKeepsTheGlobalBatch) {
  const std::map<int64_t, double> expected = reference_losses();
  std::vector<std::string> command = train("fewer");
  command.insert(command.end(), {"--set", "train.checkpoint_every=100"});
  const auto r = launch(2, "1:2", 2, {"--inject", "kill-agent:node=1:step=4"}, command);
  ASSERT_EQ(r[0].status, 0) << r[0].err << "\nnode 1:\n" << r[1].err;
  EXPECT_NE(r[0].err.find("node 0 runs as node 0 of 1 in generation 1"), std::string::npos)
      << r[0].err;
  const std::map<int64_t, double> got = losses(dir_.path() / "fewer");
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(got.size(), 8u) << r[0].err;
  for (const auto& [step, loss] : expected) {
    EXPECT_LE(std::abs(got.at(step) - loss), 1e-4 * std::abs(loss))
        << "step " << step << ": " << got.at(step) << " vs " << loss;
  }
}

// 3 nodes x 1 worker, --nnodes 2:3: node 1 is lost; node 2 goes on as
// node 1 of 2 (GROUP_RANK 1, RANK 1, WORLD_SIZE 2), still BRIGADE_NODE 2.
TEST_F(ElasticFewer, ASurvivingNodeIsRenumberedAfterTheLostOne) {
  const std::string out = dir_.path().string();
  const std::string script =
      "echo $BRIGADE_GENERATION $GROUP_RANK $RANK $WORLD_SIZE $BRIGADE_NODE > " + out +
      "/gen$BRIGADE_GENERATION.$GROUP_RANK";
  // Generation 0's workers wait; node 1 is struck through its own launcher.
  const std::string worker =
      script +
      "; if [ $BRIGADE_GENERATION = 0 ]; then if [ $GROUP_RANK = 1 ]; then kill -9 $PPID; "
      "fi; exec sleep 100; fi";
  const auto r = launch(3, "2:3", 1, {}, {"sh", "-c", worker});
  EXPECT_EQ(r[1].status, 128 + SIGKILL) << r[1].err;
  EXPECT_EQ(r[0].status, 0) << r[0].err;
  // Node 0's launcher does not wait at the end for the node left out.
  EXPECT_EQ(r[0].err.find("not every node reported its workers done"), std::string::npos)
      << r[0].err;
  EXPECT_EQ(r[2].status, 0) << r[2].err;
  EXPECT_EQ(file_text(dir_.path() / "gen0.2"), "0 2 2 3 2\n");
  EXPECT_EQ(file_text(dir_.path() / "gen1.0"), "1 0 0 2 0\n");
  EXPECT_EQ(file_text(dir_.path() / "gen1.1"), "1 1 1 2 2\n") << r[2].err;
  EXPECT_FALSE(fs::exists(dir_.path() / "gen1.2"));
}

// Refused before the rendezvous (node 1 alone: no node 0 ever comes), each
// naming the fix.
TEST_F(ElasticFewer, NodeCountsTheJobCannotGoOnWithAreRefused) {
  const auto refused = [&](const std::string& nnodes, int nproc,
                           const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"launch",
                                     "--nproc-per-node",
                                     std::to_string(nproc),
                                     "--nnodes",
                                     nnodes,
                                     "--node-rank",
                                     "1",
                                     "--rdzv",
                                     "127.0.0.1:" + std::to_string(testing::free_port()),
                                     "--rdzv-token",
                                     "fewer-test",
                                     "--max-restarts",
                                     "1"};
    args.insert(args.end(), {"--", "train", config_.string()});
    args.insert(args.end(), extra.begin(), extra.end());  // train's own
    const Output o = run_brigade(args, std::chrono::seconds(30));
    EXPECT_EQ(o.status, 1) << o.err;
    return o.err;
  };
  EXPECT_NE(refused("3:2", 2, {})
                .find("--nnodes 3:2: MIN 3 is more than MAX 2; the job starts "
                      "with MAX nodes and may go on with no fewer than MIN: pass "
                      "--nnodes 2:3"),
            std::string::npos);
  EXPECT_NE(refused("0:2", 2, {}).find("--nnodes 0:2: MIN must be at least 1"), std::string::npos);
  // dp 4 on 4 nodes of 1: on 3 nodes dp 3 would need grad_accum 4 / 3.
  const std::string uneven = refused("2:4", 1, {});
  EXPECT_NE(uneven.find("--nnodes 2:4 lets the job go on with 3 nodes"), std::string::npos)
      << uneven;
  EXPECT_NE(uneven.find("4 / 3 is not whole: pass --nnodes 4:4"), std::string::npos) << uneven;
  // A dp or grad_accum below 1 would be divided by: refused naming the key.
  EXPECT_NE(refused("1:2", 2, {"--set", "parallel.dp=0"})
                .find("but it is 0 (parallel.tp 1 x parallel.pp 1 on 4 workers): set "
                      "parallel.dp to 1 or more"),
            std::string::npos);
  EXPECT_NE(refused("1:2", 2, {"--set", "train.grad_accum=0"})
                .find("scales train.grad_accum with the nodes, but it is 0: set "
                      "train.grad_accum to 1 or more"),
            std::string::npos);
  // On 2 nodes of 2 it scales: refused only for the missing restart.
  std::vector<std::string> args = {
      "launch",      "--nproc-per-node", "2", "--nnodes", "1:2",   "--node-rank",   "1", "--rdzv",
      "127.0.0.1:1", "--rdzv-token",     "t", "--",       "train", config_.string()};
  const Output o = run_brigade(args, std::chrono::seconds(30));
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("--nnodes 1:2 goes on with fewer nodes in the job's next generation, "
                       "which is a restart: give every node --max-restarts 1 or more"),
            std::string::npos)
      << o.err;
}

// Every node must agree on how few the job may go on with: node 1 given
// plain --nnodes 2 where node 0 has 1:2 is refused at the rendezvous, before
// any worker starts (whichever compares first refuses; the other may then
// find the store gone).
TEST_F(ElasticFewer, NodesGivenDifferentMinimumsAreRefused) {
  const fs::path started = dir_.path() / "started";
  const auto r = launch(2, "1:2", 1, {}, {"touch", started.string()}, "2");
  EXPECT_EQ(r[0].status, 1) << r[0].err;
  EXPECT_EQ(r[1].status, 1) << r[1].err;
  EXPECT_NE((r[0].err + r[1].err).find("give every node and standby the same --nnodes MIN:MAX"),
            std::string::npos)
      << r[0].err << r[1].err;
  EXPECT_FALSE(fs::exists(started));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

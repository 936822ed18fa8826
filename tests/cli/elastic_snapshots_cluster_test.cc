// In-memory snapshots across nodes (elastic/snapshot_sync.h) on
// network-namespace nodes (scripts/fake_cluster.sh): 2 nodes x 2 workers of
// the tiny model, a snapshot every step and no disk checkpoint before the
// end, so a restart that resumes later than step 0 can only have resumed
// from the snapshot the nodes replicated to each other. A node's agent
// killed (a standby takes its place, fetching the lost node's part from
// its peer's replica) and a worker killed (both nodes restart in place)
// both resume from the step before the fault's (snapshot_every = 1 step
// lost; the disk would give step 0) and end bit-identical to the run
// without faults. Needs root; skipped otherwise. Every launcher is stopped
// by pid whatever happens (Started), then the cluster is brought down.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::Cluster;
using testing::ClusterResult;
using testing::read_failures;
using testing::Started;
using namespace std::chrono_literals;

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 8
seed = 5
checkpoint_every = 1000
snapshot_every = 1
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
dp = 4
timeout_s = 30
)";

constexpr int kStandby = -1;

class ElasticSnapshotsCluster : public ::testing::Test {
 protected:
  void up(const std::string& name, const std::string& net, int nodes) {
    cluster_.emplace(name, net, dir_.path());
    const ClusterResult r = cluster_->script({"up", std::to_string(nodes)});
    ASSERT_EQ(r.status, 0) << r.output;
    config_ = dir_.path() / "config.toml";
    std::ofstream(config_) << testing::kTinyModelToml << kTraining;
  }

  std::vector<std::string> launch(int node, const std::string& run, int port,
                                  const std::vector<std::string>& flags,
                                  const std::vector<std::string>& train) {
    std::vector<std::string> args = {
        testing::kBrigade,  "launch",
        "--nproc-per-node", "2",
        "--nnodes",         "2",
        "--rdzv",           cluster_->address(0) + ":" + std::to_string(port),
        "--rdzv-token",     "elastic-snapshots-test",
        "--rdzv-timeout-s", "60",
        "--max-restarts",   "2"};
    if (node == kStandby) {
      args.push_back("--standby");
    } else {
      args.insert(args.end(), {"--node-rank", std::to_string(node)});
    }
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "train", config_.string(), "--set",
                             "train.run_dir=\"" + (dir_.path() / run).string() + "\""});
    args.insert(args.end(), train.begin(), train.end());
    return args;
  }

  // Runs the job's launchers to the end (a standby's too when `standby`);
  // their outputs, node 0's first.
  std::vector<ClusterResult> run_job(const std::string& run, int port,
                                     const std::vector<std::string>& flags, bool standby,
                                     const std::vector<std::string>& train = {}) {
    std::vector<ClusterResult> results;
    Started started;
    std::vector<std::pair<pid_t, fs::path>> launchers;
    for (const int node : {0, 1, kStandby}) {
      if (node == kStandby && !standby) continue;
      const fs::path log = dir_.path() / (run + ".node" + std::to_string(node) + ".log");
      const int on = node == kStandby ? 2 : node;
      launchers.emplace_back(
          started.add(cluster_->start_on(on, launch(node, run, port, flags, train), log)), log);
    }
    for (const auto& [pid, log] : launchers) results.push_back(started.finish(pid, log, 120s));
    return results;
  }

  std::string hash(const std::string& run) {
    const auto r = testing::run_brigade({"ckpt", "hash", (dir_.path() / run).string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }

  // The final parameters of the same job without faults. ctest runs every
  // TEST in a process of its own, so the hash is kept in a file of a fixed
  // temporary directory, named by the job's config and the brigade binary
  // (its size and time: a rebuilt trainer computes it again).
  std::string reference_hash() {
    const fs::path cache_dir = fs::temp_directory_path() / "brigade_elastic_snapshots_reference";
    const std::string config = testing::read_all(config_);
    const auto binary_time = fs::last_write_time(testing::kBrigade).time_since_epoch().count();
    const std::string key = std::to_string(
        std::hash<std::string>{}(config + "|" + std::to_string(fs::file_size(testing::kBrigade)) +
                                 "|" + std::to_string(binary_time)));
    const fs::path cached = cache_dir / key;
    if (std::string reference = testing::read_all(cached); !reference.empty()) return reference;
    const auto r = run_job("reference", 29561, {}, false);
    EXPECT_EQ(r[0].status, 0) << r[0].output;
    EXPECT_EQ(r[1].status, 0) << r[1].output;
    const std::string reference = hash("reference");
    if (r[0].status == 0 && r[1].status == 0 && !reference.empty()) {
      // Renamed into place: a test reading it at the same time never sees
      // half of it.
      fs::create_directories(cache_dir);
      const fs::path partial = cache_dir / (key + "." + std::to_string(::getpid()));
      std::ofstream(partial) << reference;
      fs::rename(partial, cached);
    }
    return reference;
  }

  // The incident of the job's one restart, after checking the job ended
  // well and bit-identical to the same job without faults.
  nlohmann::json expect_recovered(const std::string& run, const std::vector<ClusterResult>& r) {
    std::string all;
    for (const ClusterResult& c : r) all += c.output + "\n----\n";
    EXPECT_EQ(r[0].status, 0) << all;
    EXPECT_EQ(hash(run), reference_hash());
    const auto lines = read_failures(dir_.path() / run / "incidents.jsonl");
    EXPECT_EQ(lines.size(), 2u) << all;
    return lines.empty() ? nlohmann::json::object() : lines[0];
  }

  testing::TempDir dir_{"brigade_elastic_snapshots"};
  std::optional<Cluster> cluster_;  // destroyed (brought down) before dir_
  fs::path config_;
};

// Node 1's agent and workers SIGKILLed after step 4: the standby takes node
// 1's place with node 1's part of step 3 from node 0, which kept its
// replica, and node 0's own part from node 0's agent.
TEST_F(ElasticSnapshotsCluster, AStandbyResumesALostNodeFromItsPeersReplica) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgsn", "10.88.31", 3);
  const auto r = run_job("lost", 29562, {"--inject", "kill-agent:node=1:step=4"}, true);
  EXPECT_EQ(r[1].status, 128 + SIGKILL) << r[1].output;
  EXPECT_EQ(r[2].status, 0) << r[2].output;
  EXPECT_NE(r[2].output.find("resumes from the in-memory snapshot of step "), std::string::npos)
      << r[2].output;
  EXPECT_NE(r[2].output.find(", as every node does"), std::string::npos) << r[2].output;
  const nlohmann::json incident = expect_recovered("lost", r);
  EXPECT_EQ(incident.value("kind", ""), "node_lost") << incident;
  // Node 1's workers wait for the fault after step 4, before step 4's
  // snapshot starts, so step 3's part is the newest there is; the agent
  // strikes once it is replicated and recorded, or after a second without
  // it (its committer renames part 3 asynchronously: on a loaded machine
  // that can take longer, and part 2 is then the newest replicated). Node
  // 0's parts are in its own area: step 3 (or 2), where the disk would give
  // step 0.
  const int64_t resumed = incident.value("resumed_from_step", -1);
  EXPECT_GE(resumed, 2) << incident;
  EXPECT_LE(resumed, 3) << incident;
}

// Worker rank 3 killed at step 4: both nodes restart in place from the
// newest step complete everywhere, gathered from each other's agents.
TEST_F(ElasticSnapshotsCluster, AKilledWorkerRestartsBothNodesFromTheSnapshot) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  up("brgsw", "10.88.32", 2);
  const auto r = run_job("killed", 29563, {}, false, {"--inject", "kill:rank=3:step=4"});
  EXPECT_EQ(r[1].status, 0) << r[1].output;
  for (const ClusterResult& c : r) {
    EXPECT_NE(c.output.find("resumes from the in-memory snapshot of step"), std::string::npos)
        << c.output;
  }
  const nlohmann::json incident = expect_recovered("killed", r);
  EXPECT_EQ(incident.value("kind", ""), "crash") << incident;
  // No disk checkpoint before step 1000: only the snapshots explain it. The
  // rank dies right after step 4, before step 4's snapshot starts; step 3's
  // parts were written during step 4 (its update waits for them), and their
  // owners serve them even when the failure cut their records short. A
  // SIGKILL can still land before node 1's committer renamed its part of
  // step 3 into place: then step 2, the newest every node holds.
  const int64_t resumed = incident.value("resumed_from_step", -1);
  EXPECT_GE(resumed, 2) << incident;
  EXPECT_LE(resumed, 3) << incident;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

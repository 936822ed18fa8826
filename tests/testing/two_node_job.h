// A test fixture for `brigade launch` jobs of 2 nodes x 2 workers (and a
// standby) on network-namespace nodes (testing/fake_cluster.h): the
// launchers' command lines, running them to the end, and the final
// parameters of the same job without faults, computed once per config and
// binary.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade::testing {

class TwoNodeJob : public ::testing::Test {
 protected:
  static constexpr int kStandby = -1;

  // `name`: the temporary directory's, the job token's and the reference
  // cache's; `training`: the TOML appended to the tiny model.
  TwoNodeJob(const std::string& name, std::string training)
      : name_(name), training_(std::move(training)), dir_("brigade_" + name) {}

  // Brings up a cluster of `nodes` of its own name and subnet.
  void up(const std::string& name, const std::string& net, int nodes = 2) {
    cluster_.emplace(name, net, dir_.path());
    const ClusterResult r = cluster_->script({"up", std::to_string(nodes)});
    ASSERT_EQ(r.status, 0) << r.output;
    config_ = dir_.path() / "config.toml";
    std::ofstream(config_) << kTinyModelToml << training_;
  }

  // Node `node`'s launcher (kStandby: a standby's) of the job writing into
  // run directory `run`; `flags`: more of launch's, `train`: of train's.
  std::vector<std::string> launch(int node, const std::string& run, int port,
                                  const std::vector<std::string>& flags = {},
                                  const std::vector<std::string>& train = {}) const {
    std::vector<std::string> args = {
        kBrigade,           "launch",
        "--nproc-per-node", "2",
        "--nnodes",         "2",
        "--rdzv",           cluster_->address(0) + ":" + std::to_string(port),
        "--rdzv-token",     name_,
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

  std::filesystem::path log_of(const std::string& run, int node) const {
    return dir_.path() / (run + ".node" + std::to_string(node) + ".log");
  }

  // Runs the job's launchers to the end (a standby's too, on namespace node
  // 2, when `standby`); their outputs, node 0's first, then node 1's and
  // the standby's. Node 0 waits up to `node0_timeout`, the others 60 s more
  // once it ended.
  std::vector<ClusterResult> run_job(
      const std::string& run, int port, const std::vector<std::string>& flags, bool standby,
      const std::vector<std::string>& train = {},
      std::chrono::seconds node0_timeout = std::chrono::seconds(180)) {
    Started started;
    std::vector<std::pair<pid_t, std::filesystem::path>> launchers;
    for (const int node : {kStandby, 1, 0}) {
      if (node == kStandby && !standby) continue;
      const int on = node == kStandby ? 2 : node;
      const std::filesystem::path log = log_of(run, on);
      launchers.emplace_back(
          started.add(cluster_->start_on(on, launch(node, run, port, flags, train), log)), log);
    }
    std::vector<ClusterResult> results;
    for (auto it = launchers.rbegin(); it != launchers.rend(); ++it) {
      results.push_back(started.finish(it->first, it->second,
                                       results.empty() ? node0_timeout : std::chrono::seconds(60)));
    }
    return results;
  }

  std::string hash(const std::string& run) const {
    const auto r = run_brigade({"ckpt", "hash", (dir_.path() / run).string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }

  // The final parameters of the same job without faults (run at `port`).
  // ctest runs every TEST in a process of its own, so the hash is kept in a
  // file of a fixed temporary directory, named by the job's config and the
  // brigade binary (its size and time: a rebuilt trainer computes it again).
  std::string reference_hash(int port) {
    const std::filesystem::path cache_dir =
        std::filesystem::temp_directory_path() / ("brigade_" + name_ + "_reference");
    const std::string config = read_all(config_);
    const auto binary_time = std::filesystem::last_write_time(kBrigade).time_since_epoch().count();
    const std::string key = std::to_string(std::hash<std::string>{}(
        config + "|" + std::to_string(std::filesystem::file_size(kBrigade)) + "|" +
        std::to_string(binary_time)));
    const std::filesystem::path cached = cache_dir / key;
    if (std::string reference = read_all(cached); !reference.empty()) return reference;
    const auto r = run_job("reference", port, {}, false);
    EXPECT_EQ(r[0].status, 0) << r[0].output << "\nnode 1:\n" << r[1].output;
    EXPECT_EQ(r[1].status, 0) << r[1].output;
    const std::string reference = hash("reference");
    if (r[0].status == 0 && r[1].status == 0 && !reference.empty()) {
      // Renamed into place: a test reading it at the same time never sees
      // half of it.
      std::filesystem::create_directories(cache_dir);
      const std::filesystem::path partial = cache_dir / (key + "." + std::to_string(::getpid()));
      std::ofstream(partial) << reference;
      std::filesystem::rename(partial, cached);
    }
    return reference;
  }

  const std::string name_, training_;
  TempDir dir_;
  std::optional<Cluster> cluster_;  // destroyed (brought down) before dir_
  std::filesystem::path config_;
};

}  // namespace brigade::testing

// `brigade launch --rdzv-backend etcd`: two loopback nodes whose
// coordinator keeps its state in a real etcd the test starts
// (tests/testing/etcd_server.h, authentication on); skipped, saying so,
// without etcd. The same over the built-in store is elastic_nodes_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/etcd_store.h"
#include "testing/etcd_server.h"
#include "testing/free_port.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
using testing::Output;
using testing::run_brigade;
constexpr char kToken[] = "etcd-launch-test-token";

std::vector<std::string> launch_args(int node, const std::string& rdzv, const std::string& etcd,
                                     const std::string& token) {
  return {"launch",
          "--nproc-per-node",
          "2",
          "--nnodes",
          "2",
          "--node-rank",
          std::to_string(node),
          "--rdzv",
          rdzv,
          "--rdzv-token",
          token,
          "--rdzv-timeout-s",
          "60",
          "--rdzv-backend",
          "etcd",
          "--rdzv-endpoints",
          etcd};
}

class EtcdLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
    etcd_ = std::make_unique<testing::EtcdServer>();
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->add_job(elastic::etcd_user(kToken), kToken, elastic::etcd_prefix(kToken)));
  }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  // Both nodes' launchers of `sh -c script` (one restart allowed) at `rdzv`,
  // each in a thread writing its outcome into r (2 entries) once it ends.
  std::vector<std::thread> start_nodes(const std::string& rdzv, const std::string& script,
                                       std::vector<Output>& r) {
    std::vector<std::thread> nodes;
    for (int node = 0; node < 2; ++node) {
      std::vector<std::string> args = launch_args(node, rdzv, etcd_->url(), kToken);
      for (const char* a : {"--max-restarts", "1", "--", "sh", "-c"}) args.push_back(a);
      args.push_back(script);
      nodes.emplace_back(
          [&r, node, args] { r[node] = run_brigade(args, std::chrono::seconds(120)); });
    }
    return nodes;
  }
  std::unique_ptr<testing::EtcdServer> etcd_;
  testing::TempDir dir_{"brigade_etcd_launch"};
};

// Rank 3 (node 1) is killed in generation 0: both nodes' workers stop and
// start again as generation 1 through the coordinator's keys in etcd, and
// the job succeeds; a job before it under the same token left an `end`
// that does not end this one.
TEST_F(EtcdLaunch, AKilledWorkerRestartsEveryNodeThroughEtcd) {
  std::string earlier_run;
  {
    elastic::EtcdCoordinatorStore earlier({etcd_->url()}, kToken, 5'000);
    earlier_run = earlier.own();
    earlier.set(elastic::coordinator_key("end"), R"({"why":"an earlier job ended"})");
  }
  const std::string out = dir_.path().string();
  const std::string script =
      "if [ $BRIGADE_GENERATION = 0 ] && [ $RANK = 3 ]; then kill -9 $$; fi; "
      "if [ $BRIGADE_GENERATION = 0 ]; then exec sleep 100; fi; "
      "echo $BRIGADE_GENERATION > " +
      out + "/done.$RANK";
  const uint16_t port = testing::free_port();
  const std::string rdzv = "127.0.0.1:" + std::to_string(port);
  std::vector<Output> r(2);
  std::vector<std::thread> nodes = start_nodes(rdzv, script, r);
  for (std::thread& t : nodes) t.join();
  EXPECT_EQ(r[0].status, 0) << "node 0:\n" << r[0].err << "\nnode 1:\n" << r[1].err;
  EXPECT_EQ(r[1].status, 0) << "node 1:\n" << r[1].err << "\nnode 0:\n" << r[0].err;
  EXPECT_NE(r[0].err.find("brigade launch: node 1: worker rank 3 (local 1, node 1) was killed"),
            std::string::npos)
      << r[0].err;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string generation;
    std::getline(in, generation);
    EXPECT_EQ(generation, "1") << "rank " << rank;
  }
  // The decisions were etcd's keys, in a run of their own (the earlier
  // one's deleted), and node 0 published its workers' store there.
  std::string keys;
  ASSERT_EQ(etcd_->run_etcdctl({"get", "--prefix", "--keys-only", elastic::etcd_prefix(kToken)},
                               /*as_root=*/true, keys),
            0)
      << keys;
  const size_t at = keys.find(elastic::etcd_prefix(kToken));
  ASSERT_NE(at, std::string::npos) << keys;
  const std::string run = keys.substr(at + elastic::etcd_prefix(kToken).size(), 16);
  EXPECT_NE(run, earlier_run);
  EXPECT_EQ(keys.find(earlier_run), std::string::npos) << keys;
  EXPECT_EQ(keys.find(elastic::etcd_prefix(kToken) + "owner"), std::string::npos)
      << "the job ended but still holds the token: " << keys;
  elastic::EtcdCoordinatorStore job({etcd_->url()}, kToken, 5'000);
  job.use_run(run);
  EXPECT_EQ(job.try_get(elastic::coordinator_key("gen/1/open")), "1");
  EXPECT_EQ(job.try_get(elastic::coordinator_key("gen/0/worker_store")), rdzv);
}

// etcd itself stops answering for about a second (SIGSTOP, as a stalled
// disk or an election would): every node's agent gives up on it after a
// call's 1 s and kills its workers; etcd answers again before the
// leader's lease and any node's silence run out, so each node reports the
// loss as its failure and both restart in place as generation 1. Leaving
// instead, every node would end the job.
TEST_F(EtcdLaunch, AnEtcdBlipThatCutsEveryNodeRestartsThemInPlace) {
  const std::string out = dir_.path().string();
  const std::string script = "if [ $BRIGADE_GENERATION = 0 ]; then echo $$ > " + out +
                             "/started.$RANK.tmp && mv " + out + "/started.$RANK.tmp " + out +
                             "/started.$RANK && exec sleep 100; fi; echo $BRIGADE_GENERATION > " +
                             out + "/done.$RANK";
  const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<Output> r(2);
  std::vector<std::thread> nodes = start_nodes(rdzv, script, r);
  // Every worker of generation 0 runs: their pids.
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int rank = 0; rank < 4 && std::chrono::steady_clock::now() < deadline;) {
    std::ifstream in(dir_.path() / ("started." + std::to_string(rank)));
    pid_t pid = 0;
    if (in >> pid) {
      workers.push_back(pid);
      ++rank;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  bool stopped = false;
  // No ASSERT before the launchers' threads are joined.
  if (workers.size() == 4 && ::kill(etcd_->pid(), SIGSTOP) == 0) {
    // Until every agent gave up on etcd and killed its workers.
    const auto cut_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto gone = [&] {
      for (const pid_t pid : workers) {
        if (::kill(pid, 0) == 0) return false;
      }
      return true;
    };
    while (!(stopped = gone()) && std::chrono::steady_clock::now() < cut_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(etcd_->pid(), SIGCONT);
  }
  for (std::thread& t : nodes) t.join();
  const std::string both = "node 0:\n" + r[0].err + "\nnode 1:\n" + r[1].err;
  ASSERT_EQ(workers.size(), 4u) << "generation 0's workers did not all start\n" << both;
  EXPECT_TRUE(stopped) << "the agents did not stop their workers within 20 s of etcd's stop\n"
                       << both;
  EXPECT_EQ(r[0].status, 0) << both;
  EXPECT_EQ(r[1].status, 0) << both;
  for (int node = 0; node < 2; ++node) {
    EXPECT_NE(
        r[node].err.find("node " + std::to_string(node) + " lost the coordinator's store for"),
        std::string::npos)
        << both;
    EXPECT_NE(r[node].err.find("it reached the store again: restarting in place"),
              std::string::npos)
        << both;
  }
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string generation;
    std::getline(in, generation);
    EXPECT_EQ(generation, "1") << "rank " << rank << "\n" << both;
  }
}

TEST_F(EtcdLaunch, AWrongTokenOrADeadEndpointIsOneLineNamingTheFix) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<std::string> args = launch_args(0, rdzv, etcd_->url(), "not-the-jobs-token");
  for (const char* a : {"--", "true"}) args.push_back(a);
  Output r = run_brigade(args, std::chrono::seconds(60));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("refused user " + elastic::etcd_user("not-the-jobs-token")),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("| etcdctl user add " + elastic::etcd_user("not-the-jobs-token") +
                       " --interactive=false"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("not-the-jobs-token"), std::string::npos) << r.err;  // the token itself

  // A short token, with etcd: refused before etcd is asked.
  args = launch_args(0, rdzv, etcd_->url(), "short-token");
  for (const char* a : {"--", "true"}) args.push_back(a);
  r = run_brigade(args, std::chrono::seconds(60));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("has 11 characters; give one of 16 or more"), std::string::npos) << r.err;

  const std::string dead = "http://127.0.0.1:" + std::to_string(testing::free_port());
  args = launch_args(1, rdzv, dead, kToken);
  for (const char* a : {"--", "true"}) args.push_back(a);
  r = run_brigade(args, std::chrono::seconds(60));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("no etcd endpoint answered"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is etcd running at " + dead), std::string::npos) << r.err;
}

TEST(EtcdLaunchFlags, BadBackendFlagsAreRefusedNamingTheFix) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--rdzv-backend", "etcd"}, "--rdzv-backend etcd needs --rdzv-endpoints URL[,URL]"},
      {{"--rdzv-endpoints", "http://a:2379"}, "add --rdzv-backend etcd"},
      {{"--rdzv-backend", "zookeeper"}, "--rdzv-backend zookeeper: unknown"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoints", "a:2379"}, "wants etcd's client URLs"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoints", "http://u:secret@a:2379"},
       "a URL with user:password@ is refused"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"launch",      "--nproc-per-node", "1", "--nnodes",
                                     "2",           "--node-rank",      "1", "--rdzv",
                                     "127.0.0.1:1", "--rdzv-token",     "t"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const char* a : {"--", "true"}) args.push_back(a);
    const Output r = run_brigade(args, std::chrono::seconds(60));
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  // A standby would wait for node 0's beat in node 0's store: with etcd it
  // is only in etcd (README: a standby does not work with etcd yet).
  const Output r = run_brigade({"launch", "--nproc-per-node", "1", "--nnodes", "2", "--standby",
                                "--rdzv", "127.0.0.1:1", "--rdzv-token", "t", "--rdzv-backend",
                                "etcd", "--rdzv-endpoints", "http://a:2379", "--", "true"},
                               std::chrono::seconds(60));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--standby does not work with --rdzv-backend etcd yet"), std::string::npos)
      << r.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

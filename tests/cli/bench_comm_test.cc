// `brigade bench comm` end to end: the real binary launches real workers over
// the shm backend, and every line it prints must be a measurement a script can
// rely on (compare_comm.py parses these lines). Plus connect_world's error for
// a worker started outside `brigade launch`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "brigade/comm/world.h"
#include "brigade/core/error.h"
#include "testing/run_brigade.h"
#include "testing/scoped_env.h"

namespace BRIGADE_TEST_FILE {

using brigade::testing::Output;
using brigade::testing::run_brigade;

TEST(BenchComm, ShmJsonLinesCoverEveryOpWithPositiveBandwidth) {
  const Output result = run_brigade(
      {"bench", "comm", "--nproc", "2", "--backend", "shm", "--max-bytes", "64K", "--json"});
  ASSERT_EQ(result.status, 0) << result.err;

  std::map<std::string, std::set<int64_t>> sizes_by_op;
  std::istringstream lines(result.out);
  int line_count = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_count;
    nlohmann::json row;
    ASSERT_NO_THROW(row = nlohmann::json::parse(line)) << "not JSON: " << line;
    EXPECT_EQ(row.at("backend"), "shm") << line;
    EXPECT_EQ(row.at("nproc"), 2) << line;
    EXPECT_GT(row.at("bytes").get<int64_t>(), 0) << line;
    EXPECT_GT(row.at("iters").get<int64_t>(), 0) << line;
    EXPECT_GT(row.at("time_us").get<double>(), 0) << line;
    EXPECT_GT(row.at("algbw_gbps").get<double>(), 0) << line;
    EXPECT_GT(row.at("busbw_gbps").get<double>(), 0) << line;
    sizes_by_op[row.at("op").get<std::string>()].insert(row.at("bytes").get<int64_t>());
  }
  // 4K, 16K, 64K for each of the four collectives and send/recv.
  EXPECT_EQ(line_count, 15) << result.out;
  const std::set<int64_t> expected_sizes = {4 << 10, 16 << 10, 64 << 10};
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv"}) {
    EXPECT_EQ(sizes_by_op[op], expected_sizes) << op << " missing sizes in:\n" << result.out;
  }
}

// --ops picks operations (in the usual order); on one node nothing goes over
// a network interface, so net_tx_bytes is 0 even for Gloo over loopback.
TEST(BenchComm, OpsSelectsOperationsAndLoopbackIsNoNetworkTraffic) {
  const Output result =
      run_brigade({"bench", "comm", "--nproc", "2", "--backend", "gloo", "--min-bytes", "64K",
                   "--max-bytes", "64K", "--ops", "broadcast,all_reduce", "--json"});
  ASSERT_EQ(result.status, 0) << result.err;
  std::vector<std::string> ops;
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    const auto row = nlohmann::json::parse(line);
    ops.push_back(row.at("op").get<std::string>());
    EXPECT_EQ(row.at("nnodes"), 1) << line;
    EXPECT_EQ(row.at("net_tx_bytes").get<double>(), 0.0) << line;
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"all_reduce", "broadcast"})) << result.out;

  const Output bad = run_brigade({"bench", "comm", "--ops", "all_reduce,allreduce"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--ops 'all_reduce,allreduce': 'allreduce' is not an operation; use "
                         "all, or a comma-separated list of all_reduce, reduce_scatter"),
            std::string::npos)
      << bad.err;
  const Output shm = run_brigade(
      {"bench", "comm", "--nnodes", "2", "--rdzv", "127.0.0.1:29555", "--backend", "shm"});
  EXPECT_EQ(shm.status, 1);
  EXPECT_NE(shm.err.find("--backend shm works within one node: across --nnodes 2 use gloo or "
                         "hierarchical"),
            std::string::npos)
      << shm.err;
}

TEST(BenchComm, RejectsSharedBuffersWithoutShm) {
  const Output result = run_brigade({"bench", "comm", "--backend", "gloo", "--shared"});
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.err.find("--backend shm"), std::string::npos) << result.err;
}

constexpr const char* kLaunchVariables[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",         "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "BRIGADE_STORE_TOKEN"};

TEST(ConnectWorld, MissingEnvironmentSaysToUseTheLauncher) {
  brigade::testing::ScopedEnv env;
  for (const char* name : kLaunchVariables) env.set(name, nullptr);
  for (const char* backend : {"shm", "gloo"}) {
    try {
      brigade::connect_world(backend, 1000);
      ADD_FAILURE() << backend << ": connect_world succeeded without the launcher's variables";
    } catch (const brigade::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("RANK"), std::string::npos) << message;
      EXPECT_NE(message.find("brigade launch"), std::string::npos) << message;
    }
  }
}

TEST(ConnectWorld, ShmAcrossNodesNamesTheFix) {
  brigade::testing::ScopedEnv env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "0");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "1");
  env.set("BRIGADE_STORE_TOKEN", "0123456789abcdef0123456789abcdef");
  try {
    brigade::connect_world("shm", 1000);
    ADD_FAILURE() << "shm accepted a job spanning two nodes";
  } catch (const brigade::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--backend gloo"), std::string::npos) << e.what();
  }
}

TEST(ConnectWorld, SegmentNameIsStableAndHidesTheToken) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string name = brigade::shm_segment_name(token, "world");
  EXPECT_EQ(name, brigade::shm_segment_name(token, "world"));
  EXPECT_NE(name, brigade::shm_segment_name(token + "x", "world"));
  EXPECT_EQ(name.rfind("/brigade-", 0), 0u) << name;
  EXPECT_EQ(name.find(token.substr(0, 8)), std::string::npos) << name;
  EXPECT_EQ(name.size(), std::string("/brigade-").size() + 16 + std::string("-world").size());
}

}  // namespace BRIGADE_TEST_FILE

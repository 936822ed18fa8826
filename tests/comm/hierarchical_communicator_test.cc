// Nodes simulated on one machine: each "node" is a shared-memory group with
// its own segment, and the nodes' leaders meet over Gloo through a store the
// test runs. Every collective is checked element by element against the
// same expectations as the flat backends.
#include "brigade/comm/hierarchical_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "brigade/comm/flight_recorder.h"
#include "brigade/comm/gloo_communicator.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/comm/world.h"
#include "testing/collective_checks.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

constexpr char kToken[] = "hierarchical-test-token";

std::unique_ptr<Communicator> connect(uint16_t store_port, int world_rank, int num_nodes,
                                      int per_node) {
  const int node = world_rank / per_node, local = world_rank % per_node;
  ShmCommunicatorOptions shm;
  shm.segment_name =
      "/brigade-hier-" + std::to_string(::getppid()) + "-node" + std::to_string(node);
  shm.group_name = "node" + std::to_string(node);
  shm.rank = local;
  shm.size = per_node;
  shm.timeout_ms = 10000;
  shm.slot_bytes = 4096;
  for (int l = 0; l < per_node; ++l) shm.world_ranks.push_back(node * per_node + l);
  std::unique_ptr<Communicator> leaders;
  if (local == 0) {
    GlooCommunicatorOptions gloo;
    gloo.store_port = store_port;
    gloo.store_token = kToken;
    gloo.group_name = "leaders";
    gloo.rank = node;
    gloo.size = num_nodes;
    gloo.timeout_ms = 10000;
    for (int n = 0; n < num_nodes; ++n) gloo.world_ranks.push_back(n * per_node);
    leaders = std::make_unique<GlooCommunicator>(gloo);
  }
  GlooCommunicatorOptions p2p;
  p2p.store_port = store_port;
  p2p.store_token = kToken;
  p2p.group_name = "p2p";
  p2p.rank = world_rank;
  p2p.size = num_nodes * per_node;
  p2p.timeout_ms = 10000;
  return std::make_unique<HierarchicalCommunicator>("world", std::make_unique<ShmCommunicator>(shm),
                                                    std::move(leaders), num_nodes,
                                                    std::make_unique<GlooCommunicator>(p2p));
}

class HierarchicalCommunicatorShapes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(HierarchicalCommunicatorShapes, EveryCollectiveMatchesElementByElement) {
  const auto [num_nodes, per_node] = GetParam();
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const uint16_t port = server.port();
  const auto pids = testing::fork_ranks(num_nodes * per_node, [&](int world_rank) {
    auto comm = connect(port, world_rank, num_nodes, per_node);
    testing::require(comm->rank() == world_rank, "rank {} instead of {}", comm->rank(), world_rank);
    testing::require(comm->size() == num_nodes * per_node, "size {}", comm->size());
    testing::check_every_collective<float>(*comm, DType::kF32, {0, 1, 1003});
    testing::check_every_collective<int64_t>(*comm, DType::kI64, {5, 777});
    // Around the ring, some neighbours share a node and some do not.
    testing::check_point_to_point<float>(*comm, DType::kF32, {0, 1003, 100'000});
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(30));
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(NodesTimesRanks, HierarchicalCommunicatorShapes,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(3, 2),
                                           std::make_tuple(2, 3)));

// Every process of a hierarchical job has several groups (the hierarchical
// one, its node's shm group, the gloo point-to-point group, and on leaders
// the leaders' group), and group ranks repeat across nodes: the dumps of one
// run directory must still be one file per (world rank, group), none
// overwriting another, each naming the group's members by world rank, with
// no key repeated between the collectives and the sends/recvs of a group.
// Built by connect_world, so the members are the ones production computes.
TEST(HierarchicalCommunicator, EveryGroupDumpsItsOwnFileNamedByWorldRank) {
  constexpr int kNodes = 2, kPerNode = 2, kWorld = kNodes * kPerNode;
  const std::string token = "hier-fr-" + std::to_string(::getpid());
  TcpStoreServer server("127.0.0.1", 0, token);
  testing::TempDir dir("brigade_hier_flight_recorder");
  const auto pids = testing::fork_ranks(kWorld, [&](int world_rank) {
    const std::map<std::string, std::string> environment = {
        {"RANK", std::to_string(world_rank)},
        {"WORLD_SIZE", std::to_string(kWorld)},
        {"LOCAL_RANK", std::to_string(world_rank % kPerNode)},
        {"LOCAL_WORLD_SIZE", std::to_string(kPerNode)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(server.port())},
        {"BRIGADE_STORE_TOKEN", token},
        {"GLOO_SOCKET_IFNAME", "lo"},  // "nodes" on one machine
        {"BRIGADE_FLIGHT_RECORDER_DIR", dir.path().string()}};
    for (const auto& [name, value] : environment) ::setenv(name.c_str(), value.c_str(), 1);
    auto comm = connect_world("hierarchical", 10'000);
    testing::check_every_collective<float>(*comm, DType::kF32, {0, 1003});
    // Around the ring: ranks 0-1 and 2-3 share a node (shm), 1-2 and 3-0 do not.
    testing::check_point_to_point<float>(*comm, DType::kF32, {0, 1003});
    comm->barrier()->wait();
    FlightRecorder::global().dump_to_run_dir();
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(60));
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;

  std::map<std::string, std::vector<int>> expected_members = {{"world", {0, 1, 2, 3}},
                                                              {"world.p2p", {0, 1, 2, 3}},
                                                              {"world.node0", {0, 1}},
                                                              {"world.node1", {2, 3}},
                                                              {"world.leaders", {0, 2}}};
  std::set<std::string> seen;
  bool node_group_had_both_kinds = false;
  for (int world_rank = 0; world_rank < kWorld; ++world_rank) {
    std::vector<std::string> groups = {"world", "world.p2p",
                                       world_rank < kPerNode ? "world.node0" : "world.node1"};
    if (world_rank % kPerNode == 0) groups.push_back("world.leaders");
    for (const std::string& group : groups) {
      const std::string name = fmt::format("flight_recorder_rank{}_{}.json", world_rank, group);
      std::ifstream in(dir.path() / name);
      ASSERT_TRUE(in) << name << " was not written";
      seen.insert(name);
      const nlohmann::json j = nlohmann::json::parse(in);
      const auto& members = expected_members.at(group);
      EXPECT_EQ(j["world_rank"], world_rank) << name;
      EXPECT_EQ(j["group"]["name"], group) << name;
      EXPECT_EQ(j["group"]["size"], members.size()) << name;
      EXPECT_EQ(j["group"]["members"], members) << name;
      const int group_rank = j["group"]["rank"];
      EXPECT_EQ(members.at(group_rank), world_rank) << name;
      ASSERT_FALSE(j["records"].empty()) << name;
      std::set<std::string> keys, kinds;
      for (const auto& record : j["records"]) {
        EXPECT_EQ(record["group"], group) << name;
        EXPECT_TRUE(keys.insert(record["key"].get<std::string>()).second)
            << name << ": key " << record["key"] << " twice";
        kinds.insert(record["kind"].get<std::string>());
      }
      if (group.rfind("world.node", 0) == 0 && kinds.size() == 2) node_group_had_both_kinds = true;
    }
  }
  EXPECT_EQ(seen.size(), 14u);
  EXPECT_TRUE(node_group_had_both_kinds)
      << "no node group recorded both collectives and sends/recvs";
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// Nodes simulated on one machine: each "node" is a shared-memory group with
// its own segment, and the nodes' leaders meet over Gloo through a store the
// test runs. Every collective is checked element by element against the
// same expectations as the flat backends.
#include "brigade/comm/hierarchical_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <tuple>

#include "brigade/comm/gloo_communicator.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/comm/tcp_store.h"
#include "testing/collective_checks.h"
#include "testing/forked_ranks.h"

namespace brigade {
namespace {

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
  std::unique_ptr<Communicator> leaders;
  if (local == 0) {
    GlooCommunicatorOptions gloo;
    gloo.store_port = store_port;
    gloo.store_token = kToken;
    gloo.group_name = "leaders";
    gloo.rank = node;
    gloo.size = num_nodes;
    gloo.timeout_ms = 10000;
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

}  // namespace
}  // namespace brigade

// A group that spans nodes, built from two faster pieces: a communicator
// among the ranks of this node (shared memory) and one among the nodes'
// leaders (local rank 0 of every node, over TCP). Only the leaders send
// anything across nodes, once per operation, so the slow network carries one
// copy of the data per node instead of one per rank.
//
// World rank = node * ranks_per_node + local rank (brigade launch's order),
// every node holding the same number of ranks.
//
//   all_reduce:  node all-reduce -> leaders all-reduce -> node broadcast
//   broadcast:   root's node broadcast -> leaders broadcast -> node broadcast
//   all_gather:  node all-gather -> leaders all-gather -> node broadcast
//   reduce_scatter: all_reduce of a copy, then this rank's segment (simple,
//                   moves the whole buffer; fine until ZeRO across nodes
//                   needs better)
//   barrier:     node barrier -> leaders barrier -> node barrier
//   send/recv:   to a rank on this node through the node group; to another
//                node through `cross_node`, a flat world-wide group (Gloo)
//
// avg is the sum divided by the world size once at the end, so it is exact
// for sums that are.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "brigade/comm/communicator.h"

namespace brigade {

class OpQueue;

class HierarchicalCommunicator final : public Communicator {
 public:
  // node: this node's ranks (size ranks_per_node, rank = local rank).
  // leaders: the leaders' group (rank = node index), non-null exactly on
  // local rank 0. cross_node: a group of every rank (same rank numbers as
  // this one) for send/recv between nodes; null if none is needed.
  // world_ranks: the world rank of each rank of this group, for the flight
  // recorder; empty when they are the same.
  HierarchicalCommunicator(std::string group_name, std::unique_ptr<Communicator> node,
                           std::unique_ptr<Communicator> leaders, int num_nodes,
                           std::unique_ptr<Communicator> cross_node = nullptr,
                           std::vector<int> world_ranks = {});
  ~HierarchicalCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& group_name() const override { return group_name_; }
  int64_t timeout_ms() const override;

  std::shared_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                                       ReduceOp op) override;
  std::shared_ptr<Work> all_gather(const void* input, void* output, int64_t count,
                                   DType dtype) override;
  std::shared_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override;
  std::shared_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override;

 private:
  // The group that carries point-to-point traffic to `peer`, and the peer's
  // rank in it.
  std::pair<Communicator*, int> route(int peer, const char* what);
  bool leader() const { return leaders_ != nullptr; }
  int node_index() const;
  void run_all_reduce(std::byte* data, int64_t count, DType dtype, ReduceOp op);

  std::string group_name_;
  std::unique_ptr<Communicator> node_;
  std::unique_ptr<Communicator> leaders_;
  std::unique_ptr<Communicator> cross_node_;
  int num_nodes_;
  int leader_node_ = 0;  // set from leaders_ on local rank 0, from node 0 otherwise
  std::unique_ptr<OpQueue> ops_;
};

}  // namespace brigade

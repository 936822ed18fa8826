#include "brigade/comm/hierarchical_communicator.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "brigade/comm/op_description.h"
#include "brigade/comm/op_queue.h"

namespace brigade {
namespace {

template <typename T>
void divide(std::byte* data, int64_t count, int divisor) {
  T* values = reinterpret_cast<T*>(data);
  for (int64_t i = 0; i < count; ++i) values[i] /= static_cast<T>(divisor);
}

void divide_by(std::byte* data, int64_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kF32:
      return divide<float>(data, count, divisor);
    case DType::kF64:
      return divide<double>(data, count, divisor);
    case DType::kI32:
      return divide<int32_t>(data, count, divisor);
    case DType::kI64:
      return divide<int64_t>(data, count, divisor);
  }
}

}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(std::string group_name,
                                                   std::unique_ptr<Communicator> node,
                                                   std::unique_ptr<Communicator> leaders,
                                                   int num_nodes,
                                                   std::unique_ptr<Communicator> cross_node,
                                                   std::vector<int> world_ranks)
    : group_name_(std::move(group_name)),
      node_(std::move(node)),
      leaders_(std::move(leaders)),
      cross_node_(std::move(cross_node)),
      num_nodes_(num_nodes) {
  BRIGADE_CHECK(node_ != nullptr);
  BRIGADE_CHECK((node_->rank() == 0) == (leaders_ != nullptr),
                "exactly the node's local rank 0 leads it");
  BRIGADE_CHECK(leaders_ == nullptr || leaders_->size() == num_nodes_);
  // Every rank needs its node's index; the leader knows it and tells the node.
  int64_t index = leader() ? leaders_->rank() : 0;
  node_->broadcast(&index, 1, DType::kI64, 0)->wait();
  leader_node_ = static_cast<int>(index);
  ops_ = std::make_unique<OpQueue>(
      "hierarchical", group_name_, rank(), size(),
      [](const OpQueue::Op& op, std::exception_ptr e) {
        try {
          std::rethrow_exception(e);
        } catch (const CommError& inner) {
          return CommError(fmt::format("hierarchical {} seq {}: {}", op.what, op.seq, inner.what()),
                           inner.peer_ranks());
        } catch (const std::exception& inner) {
          return CommError(fmt::format("hierarchical {} seq {}: {}", op.what, op.seq, inner.what()),
                           {});
        }
      },
      std::move(world_ranks));
  ops_->start();
  BRIGADE_CHECK(
      cross_node_ == nullptr || (cross_node_->size() == size() && cross_node_->rank() == rank()),
      "the cross-node group numbers ranks like this one");
}

HierarchicalCommunicator::~HierarchicalCommunicator() {
  ops_.reset();
}

int HierarchicalCommunicator::node_index() const {
  return leader_node_;
}
int HierarchicalCommunicator::rank() const {
  return node_index() * node_->size() + node_->rank();
}
int HierarchicalCommunicator::size() const {
  return num_nodes_ * node_->size();
}
int64_t HierarchicalCommunicator::timeout_ms() const {
  return node_->timeout_ms();
}

void HierarchicalCommunicator::run_all_reduce(std::byte* data, int64_t count, DType dtype,
                                              ReduceOp op) {
  const ReduceOp partial = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  node_->all_reduce(data, count, dtype, partial)->wait();
  if (leader()) leaders_->all_reduce(data, count, dtype, partial)->wait();
  node_->broadcast(data, count, dtype, 0)->wait();
  if (op == ReduceOp::kAvg) divide_by(data, count, dtype, size());
}

std::shared_ptr<Work> HierarchicalCommunicator::all_reduce(void* data, int64_t count, DType dtype,
                                                           ReduceOp op) {
  auto* bytes = static_cast<std::byte*>(data);
  return ops_->enqueue(describe::all_reduce(count, dtype, op), count * dtype_bytes(dtype),
                       [this, bytes, count, dtype, op](const OpQueue::Op&) {
                         run_all_reduce(bytes, count, dtype, op);
                       });
}

std::shared_ptr<Work> HierarchicalCommunicator::reduce_scatter(const void* input, void* output,
                                                               int64_t count, DType dtype,
                                                               ReduceOp op) {
  const auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return ops_->enqueue(describe::reduce_scatter(count, dtype, op),
                       count * size() * dtype_bytes(dtype),
                       [this, in, out, count, dtype, op](const OpQueue::Op&) {
                         const int64_t elem = dtype_bytes(dtype);
                         std::vector<std::byte> all(in, in + count * size() * elem);
                         run_all_reduce(all.data(), count * size(), dtype, op);
                         // count 0 may come with a null output
                         if (count > 0) {
                           std::memcpy(out, all.data() + rank() * count * elem, count * elem);
                         }
                       });
}

std::shared_ptr<Work> HierarchicalCommunicator::all_gather(const void* input, void* output,
                                                           int64_t count, DType dtype) {
  const auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return ops_->enqueue(
      describe::all_gather(count, dtype), count * dtype_bytes(dtype),
      [this, in, out, count, dtype](const OpQueue::Op&) {
        const int64_t node_count = count * node_->size();
        std::vector<std::byte> node_part(static_cast<size_t>(node_count * dtype_bytes(dtype)));
        node_->all_gather(in, node_part.data(), count, dtype)->wait();
        if (leader()) leaders_->all_gather(node_part.data(), out, node_count, dtype)->wait();
        node_->broadcast(out, node_count * num_nodes_, dtype, 0)->wait();
      });
}

std::shared_ptr<Work> HierarchicalCommunicator::broadcast(void* data, int64_t count, DType dtype,
                                                          int root) {
  if (root < 0 || root >= size()) {
    throw_error("hierarchical broadcast on group '{}': root {} is not in a group of size {}",
                group_name_, root, size());
  }
  auto* bytes = static_cast<std::byte*>(data);
  return ops_->enqueue(describe::broadcast(count, dtype, root), count * dtype_bytes(dtype),
                       [this, bytes, count, dtype, root](const OpQueue::Op&) {
                         const int root_node = root / node_->size(),
                                   root_local = root % node_->size();
                         if (node_index() == root_node)
                           node_->broadcast(bytes, count, dtype, root_local)->wait();
                         if (leader()) leaders_->broadcast(bytes, count, dtype, root_node)->wait();
                         if (node_index() != root_node)
                           node_->broadcast(bytes, count, dtype, 0)->wait();
                       });
}

std::shared_ptr<Work> HierarchicalCommunicator::barrier() {
  return ops_->enqueue("barrier", 0, [this](const OpQueue::Op&) {
    node_->barrier()->wait();
    if (leader()) leaders_->barrier()->wait();
    node_->barrier()->wait();
  });
}

std::pair<Communicator*, int> HierarchicalCommunicator::route(int peer, const char* what) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw_error(
        "hierarchical {} on group '{}' (rank {} of {}): peer {} must be another rank of "
        "the group",
        what, group_name_, rank(), size(), peer);
  }
  if (peer / node_->size() == node_index()) return {node_.get(), peer % node_->size()};
  if (cross_node_ == nullptr) {
    throw_error(
        "hierarchical {} on group '{}': rank {} is on another node and this group was "
        "built without a cross-node group for point-to-point",
        what, group_name_, peer);
  }
  return {cross_node_.get(), peer};
}

std::shared_ptr<Work> HierarchicalCommunicator::send(const void* data, int64_t count, DType dtype,
                                                     int peer, uint32_t tag) {
  const auto [group, group_peer] = route(peer, "send");
  return group->send(data, count, dtype, group_peer, tag);
}

std::shared_ptr<Work> HierarchicalCommunicator::recv(void* data, int64_t count, DType dtype,
                                                     int peer, uint32_t tag) {
  const auto [group, group_peer] = route(peer, "recv");
  return group->recv(data, count, dtype, group_peer, tag);
}

}  // namespace brigade

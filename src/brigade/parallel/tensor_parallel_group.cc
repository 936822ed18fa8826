#include "brigade/parallel/tensor_parallel_group.h"

#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"

namespace brigade {

TensorParallelGroup::TensorParallelGroup(Communicator& group) : group_(group) {}

int TensorParallelGroup::rank() const {
  return group_.rank();
}

int TensorParallelGroup::size() const {
  return group_.size();
}

void TensorParallelGroup::all_reduce_sum(float* data, int64_t count) {
  const int64_t start = now_ns();
  group_.all_reduce(data, count, DType::kF32, ReduceOp::kSum)->wait();
  comm_ns_ += now_ns() - start;
}

void TensorParallelGroup::all_gather(const float* in, float* out, int64_t count) {
  const int64_t start = now_ns();
  group_.all_gather(in, out, count, DType::kF32)->wait();
  comm_ns_ += now_ns() - start;
}

void TensorParallelGroup::reduce_scatter_sum(const float* in, float* out, int64_t count) {
  const int64_t start = now_ns();
  group_.reduce_scatter(in, out, count, DType::kF32, ReduceOp::kSum)->wait();
  comm_ns_ += now_ns() - start;
}

double TensorParallelGroup::take_comm_ms() {
  const double ms = static_cast<double>(comm_ns_) * 1e-6;
  comm_ns_ = 0;
  return ms;
}

}  // namespace brigade

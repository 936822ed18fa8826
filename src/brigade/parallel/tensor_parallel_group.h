// The model's tensor-parallel handle (model/tensor_parallel.h) over a
// communicator: the tp group of a Mesh, whose ranks are consecutive world
// ranks (so on one node). The calls block: the model needs each sum before
// its next kernel, so there is nothing to overlap them with in this scheme;
// the time they take is what tensor parallelism exposes, and is counted.
#pragma once

#include <cstdint>

#include "brigade/model/tensor_parallel.h"

namespace brigade {

class Communicator;

class TensorParallelGroup final : public TensorParallel {
 public:
  // group: the tp ranks, in tp-rank order; it must outlive this handle.
  explicit TensorParallelGroup(Communicator& group);

  int rank() const override;
  int size() const override;
  void all_reduce_sum(float* data, int64_t count) override;
  void all_gather(const float* in, float* out, int64_t count) override;
  void reduce_scatter_sum(const float* in, float* out, int64_t count) override;

  // Milliseconds spent in the group's collectives since the last call
  // (all of it exposed: compute waits for each one).
  double take_comm_ms();

 private:
  Communicator& group_;
  int64_t comm_ns_ = 0;
};

}  // namespace brigade

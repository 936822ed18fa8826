// The tensor-parallel handle the model sees (ARCHITECTURE.md decision 3):
// the group of ranks that split each block's matrices Megatron's way, as
// collectives on float buffers and nothing else. The model never sees a
// communicator; parallel/tensor_parallel_group.h implements this over one.
//
// Every call is blocking and collective: each rank of the group makes the
// same calls with the same counts in the same order, and every rank ends
// with bit-identical results (so replicated parameters, updated from equal
// gradients, stay equal on every rank).
#pragma once

#include <cstdint>

namespace brigade {

class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;  // in [0, size())
  virtual int size() const = 0;
  // data[0, count) <- the sum of every rank's data[0, count).
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  // out[s*count, (s+1)*count) <- rank s's in[0, count).
  virtual void all_gather(const float* in, float* out, int64_t count) = 0;
  // out[0, count) <- the sum over ranks of their in[rank()*count, (rank()+1)*count).
  virtual void reduce_scatter_sum(const float* in, float* out, int64_t count) = 0;
};

}  // namespace brigade

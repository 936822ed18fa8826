// Every collective of a Communicator checked element by element against
// values computed locally, for any backend. Meant to run inside each forked
// rank (see forked_ranks.h): a mismatch throws, naming the operation, dtype,
// count and element.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "brigade/comm/communicator.h"
#include "testing/forked_ranks.h"

namespace brigade::testing {

// Small integers, negative too, so sums are exact in every dtype and the
// order in which ranks add them cannot matter.
template <typename T>
T value_of(int rank, int64_t index) {
  return static_cast<T>((index * 7 + rank * 13) % 23 - 11);
}

template <typename T>
T expected_reduction(ReduceOp op, int size, int64_t index) {
  T acc = value_of<T>(0, index);
  for (int r = 1; r < size; ++r) {
    const T v = value_of<T>(r, index);
    acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
  }
  if (op == ReduceOp::kAvg) acc /= static_cast<T>(size);
  return acc;
}

// all_reduce and reduce_scatter with every op, all_gather and broadcast, for
// each count (0, 1, counts not divisible by the group size, several KiB), then
// a barrier.
template <typename T>
void check_every_collective(Communicator& comm, DType dtype,
                            const std::vector<int64_t>& counts = {0, 1, 5, 1003, 2500}) {
  const int rank = comm.rank();
  const int size = comm.size();
  for (int64_t count : counts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<T> data(count);
      for (int64_t i = 0; i < count; ++i) data[i] = value_of<T>(rank, i);
      comm.all_reduce(data.data(), count, dtype, op)->wait();
      for (int64_t i = 0; i < count; ++i) {
        require(data[i] == expected_reduction<T>(op, size, i),
                "all_reduce {} {} count {}: element {} is {}, expected {}", dtype_name(dtype),
                reduce_op_name(op), count, i, data[i], expected_reduction<T>(op, size, i));
      }

      // Segment s of rank r's input holds value_of(r, s * count + j).
      std::vector<T> input(count * size);
      for (int64_t i = 0; i < count * size; ++i) input[i] = value_of<T>(rank, i);
      std::vector<T> output(count, T{-77});
      comm.reduce_scatter(input.data(), output.data(), count, dtype, op)->wait();
      for (int64_t j = 0; j < count; ++j) {
        const T expected = expected_reduction<T>(op, size, rank * count + j);
        require(output[j] == expected,
                "reduce_scatter {} {} count {}: element {} is {}, expected {}", dtype_name(dtype),
                reduce_op_name(op), count, j, output[j], expected);
      }
    }

    std::vector<T> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = value_of<T>(rank, i);
    std::vector<T> gathered(count * size, T{-77});
    comm.all_gather(mine.data(), gathered.data(), count, dtype)->wait();
    for (int s = 0; s < size; ++s) {
      for (int64_t i = 0; i < count; ++i) {
        require(gathered[s * count + i] == value_of<T>(s, i),
                "all_gather {} count {}: element {} of rank {} is {}, expected {}",
                dtype_name(dtype), count, i, s, gathered[s * count + i], value_of<T>(s, i));
      }
    }

    // In place, as ZeRO uses them: reduce_scatter into my own segment of the
    // input, all_gather from my own segment of the output.
    std::vector<T> in_place(count * size);
    for (int64_t i = 0; i < count * size; ++i) in_place[i] = value_of<T>(rank, i);
    comm.reduce_scatter(in_place.data(), in_place.data() + rank * count, count, dtype,
                        ReduceOp::kSum)
        ->wait();
    for (int64_t j = 0; j < count; ++j) {
      const T expected = expected_reduction<T>(ReduceOp::kSum, size, rank * count + j);
      require(in_place[rank * count + j] == expected,
              "in-place reduce_scatter {} count {}: element {} is {}, expected {}",
              dtype_name(dtype), count, j, in_place[rank * count + j], expected);
    }
    for (int64_t i = 0; i < count; ++i) in_place[rank * count + i] = value_of<T>(rank, i);
    comm.all_gather(in_place.data() + rank * count, in_place.data(), count, dtype)->wait();
    for (int s = 0; s < size; ++s) {
      for (int64_t i = 0; i < count; ++i) {
        require(in_place[s * count + i] == value_of<T>(s, i),
                "in-place all_gather {} count {}: element {} of rank {} is {}, expected {}",
                dtype_name(dtype), count, i, s, in_place[s * count + i], value_of<T>(s, i));
      }
    }

    const int root = static_cast<int>(count % size);
    std::vector<T> broadcasted(count, T{-99});
    if (rank == root) broadcasted = mine;
    comm.broadcast(broadcasted.data(), count, dtype, root)->wait();
    for (int64_t i = 0; i < count; ++i) {
      require(broadcasted[i] == value_of<T>(root, i),
              "broadcast {} count {} root {}: element {} is {}, expected {}", dtype_name(dtype),
              count, root, i, broadcasted[i], value_of<T>(root, i));
    }
  }
  comm.barrier()->wait();
}

// send/recv around the ring (to rank+1, from rank-1): every rank posts all
// its sends before any recv (eager sends must not deadlock), two tags are
// received in the opposite order to how they were sent, and two messages
// share each tag (matched oldest first).
template <typename T>
void check_point_to_point(Communicator& comm, DType dtype, const std::vector<int64_t>& counts) {
  const int rank = comm.rank();
  const int size = comm.size();
  if (size < 2) return;
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  constexpr uint32_t kTags[4] = {7, 7, 3, 3};  // message k goes with tag kTags[k]
  for (int64_t count : counts) {
    std::vector<std::vector<T>> out(4, std::vector<T>(count));
    std::vector<std::vector<T>> in(4, std::vector<T>(count, T{-55}));
    for (int k = 0; k < 4; ++k) {
      for (int64_t i = 0; i < count; ++i) out[k][i] = value_of<T>(rank * 4 + k, i);
    }
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k)
      works.push_back(comm.send(out[k].data(), count, dtype, next, kTags[k]));
    for (int k : {2, 3, 0, 1})
      works.push_back(comm.recv(in[k].data(), count, dtype, prev, kTags[k]));
    for (auto& work : works) work->wait();
    for (int k = 0; k < 4; ++k) {
      for (int64_t i = 0; i < count; ++i) {
        require(in[k][i] == value_of<T>(prev * 4 + k, i),
                "recv {} count {} message {} (tag {}) from rank {}: element {} is {}, expected {}",
                dtype_name(dtype), count, k, kTags[k], prev, i, in[k][i],
                value_of<T>(prev * 4 + k, i));
      }
    }
  }
  comm.barrier()->wait();
}

}  // namespace brigade::testing

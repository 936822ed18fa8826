// How operations are named in errors, the flight recorder and traces, and
// the operand checks every backend makes first: one wording for all
// backends, so dumps and messages from different backends compare.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"

namespace brigade::describe {

inline std::string all_reduce(int64_t count, DType dtype, ReduceOp op) {
  return fmt::format("all_reduce(count {}, {}, {})", count, dtype_name(dtype), reduce_op_name(op));
}
inline std::string reduce_scatter(int64_t count, DType dtype, ReduceOp op) {
  return fmt::format("reduce_scatter(count {} per rank, {}, {})", count, dtype_name(dtype),
                     reduce_op_name(op));
}
inline std::string all_gather(int64_t count, DType dtype) {
  return fmt::format("all_gather(count {} per rank, {})", count, dtype_name(dtype));
}
inline std::string broadcast(int64_t count, DType dtype, int root) {
  return fmt::format("broadcast(count {}, {}, root {})", count, dtype_name(dtype), root);
}
inline std::string send(int64_t count, DType dtype, int peer, uint32_t tag) {
  return fmt::format("send(count {}, {}, to rank {}, tag {})", count, dtype_name(dtype), peer, tag);
}
inline std::string recv(int64_t count, DType dtype, int peer, uint32_t tag) {
  return fmt::format("recv(count {}, {}, from rank {}, tag {})", count, dtype_name(dtype), peer,
                     tag);
}

// A negative count, or a null buffer for a non-empty operation, is the
// caller's bug: an Error naming the backend and the operation.
inline void check_operand(const char* backend, const void* buffer, int64_t count,
                          const char* what) {
  if (count < 0) throw_error("{} {}: count must be >= 0, got {}", backend, what, count);
  if (count > 0 && buffer == nullptr) {
    throw_error("{} {}: null buffer for {} elements", backend, what, count);
  }
}

}  // namespace brigade::describe

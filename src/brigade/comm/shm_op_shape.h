// What a rank of the shared-memory backend runs at one synchronisation
// phase: the collective, the protocol it chose for it, and its operand's
// shape, packed into two words that the rank publishes in its control line
// with every arrive.
//
// The protocol is chosen per rank (a buffer in the rank's shared region goes
// in place, any other is staged through the slots), and the protocols run
// different synchronisation sequences and read peers' memory in different
// layouts. Ranks that chose differently, or that disagree on the count,
// dtype, reduction or root, would corrupt each other's results silently or
// hang; so after every wait each rank compares the words its peers published
// for that phase with its own, and a difference fails the operation on every
// rank, naming both sides' choices.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "brigade/comm/communicator.h"

namespace brigade::shm {

enum class Collective : uint8_t {
  kAllReduce = 1,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier
};

// How operands travel: small (copied whole through the slots, one
// synchronisation), staged (through the slots, chunk by chunk), or in place
// (each rank reads its peers' operands where they lie in the shared region).
enum class Protocol : uint8_t { kSmall = 1, kStaged, kInPlace };

struct OpShape {
  Collective collective = Collective::kBarrier;
  Protocol protocol = Protocol::kStaged;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // reductions only
  int root = 0;                  // broadcast only
  int64_t count = 0;

  // collective | protocol << 8 | dtype << 16 | op << 24 | root << 32; the
  // count is the second word.
  uint64_t word() const {
    return static_cast<uint64_t>(collective) | static_cast<uint64_t>(protocol) << 8 |
           static_cast<uint64_t>(dtype) << 16 | static_cast<uint64_t>(op) << 24 |
           static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32;
  }
  static OpShape from_words(uint64_t word, uint64_t count) {
    OpShape s;
    s.collective = static_cast<Collective>(word & 0xff);
    s.protocol = static_cast<Protocol>((word >> 8) & 0xff);
    s.dtype = static_cast<DType>((word >> 16) & 0xff);
    s.op = static_cast<ReduceOp>((word >> 24) & 0xff);
    s.root = static_cast<int>(static_cast<uint32_t>(word >> 32));
    s.count = static_cast<int64_t>(count);
    return s;
  }

  // "all_reduce of 3001 f32 (sum) in place (operand in the shared buffer)".
  // A peer's words are read from shared memory, so unknown values print as
  // such rather than being trusted.
  std::string describe() const {
    const char* how = protocol == Protocol::kSmall    ? "through the slots (small path)"
                      : protocol == Protocol::kStaged ? "staged (operand outside the shared buffer)"
                      : protocol == Protocol::kInPlace ? "in place (operand in the shared buffer)"
                                                       : "by an unknown protocol";
    switch (collective) {
      case Collective::kAllReduce:
        return fmt::format("all_reduce of {} {} ({}) {}", count, dtype_name(dtype),
                           reduce_op_name(op), how);
      case Collective::kReduceScatter:
        return fmt::format("reduce_scatter of {} {} per rank ({}) {}", count, dtype_name(dtype),
                           reduce_op_name(op), how);
      case Collective::kAllGather:
        return fmt::format("all_gather of {} {} per rank {}", count, dtype_name(dtype), how);
      case Collective::kBroadcast:
        return fmt::format("broadcast of {} {} from root {}", count, dtype_name(dtype), root);
      case Collective::kBarrier:
        return "barrier";
    }
    return fmt::format("an unknown operation (shape word {:#x}, count {})", word(), count);
  }
};

}  // namespace brigade::shm

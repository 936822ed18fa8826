// ShmCommunicator: collectives among the processes of one machine over one
// POSIX shared-memory segment. The intra-node fast path.
//
// The segment holds a header, one control line per rank (its pid and the last
// synchronisation phase it reached, each on its own cache lines so ranks do
// not fight over them) and one data slot per rank:
//
//   [Header][RankControl x size][slot 0][slot 1]...[slot size-1]
//
// Each slot has two halves used alternately by successive chunks, so a rank
// can fill one half while slower peers still read the other; that removes one
// synchronisation per chunk. An all-reduce of a chunk goes:
//   1. every rank copies its chunk into its slot;              (arrive, wait)
//   2. rank r reduces ITS 1/size share of the elements, reading every peer's
//      slot directly, and leaves the result in its own slot;  (arrive, wait)
//   3. every rank copies each share from its owner's slot.
// So each element is reduced by exactly one rank (results are bit-identical
// everywhere) and the reduction work is spread evenly. All-reduces of at most
// 64 KiB skip the middle step: every rank copies in, arrives once, and sums
// all slots in rank order itself (same sums everywhere, one synchronisation
// instead of two); the caller's thread runs them when the queue is idle,
// polling up to 1 ms before handing the rest to the thread. Reduce-scatter,
// all-gather and broadcast are the halves of that pattern. Buffers larger
// than half a slot go through in chunks.
//
// Synchronisation is one monotonically increasing phase counter per rank:
// "arrive" stores my next phase, "wait" spins (then yields, then naps) until
// every peer's counter reaches it, watching the deadline. The ranks whose
// counters are behind are exactly the ones a timeout names. While waiting it
// also notices a peer process that no longer exists and fails at once.
// With each phase a rank also publishes what it runs there (the collective,
// the protocol it chose, count, dtype, reduction, root: shm_op_shape.h), and
// after each wait it compares its peers' with its own, so ranks that
// disagree fail with a CommError naming both choices instead of corrupting
// each other's data or hanging; the check rides on the wait, adding no
// synchronisation.
//
// send/recv go through per-pair rings in the same segment, driven by their
// own progress thread; large messages are copied once, straight from the
// sender's buffer (shm_mailbox.h).
//
// Rendezvous: rank 0 creates the segment under the caller's name (it removes
// a leftover of that name first), the others open it by name, retrying until
// timeout_ms. Once every rank has attached, rank 0 unlinks the name, so
// nothing is left in /dev/shm even if the job is killed later. The name must
// be unique per job and group (derive it from the job's token).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/communicator.h"

namespace brigade {

struct ShmCommunicatorOptions {
  // POSIX shm name, "/brigade-<job token>-<group>": a leading '/', no other '/'.
  std::string segment_name;
  std::string group_name = "world";
  int rank = 0;
  int size = 1;
  // Bounds the rendezvous in the constructor and every operation.
  int64_t timeout_ms = 300'000;
  // Bytes of staging per rank (two halves). Larger slots mean fewer
  // synchronisations per byte; 4 MiB halves sit well inside L2+L3 of two
  // cores. At least 256 * size, a multiple of 256.
  int64_t slot_bytes = 8 << 20;
  // Bytes per rank of peer-visible memory for shared_buffer(): a buffer that
  // lives there (a training rank's flat gradient buffer, say) is reduced and
  // gathered in place, each rank reading its peers' buffers directly, with no
  // copy in or out. A multiple of 4096; 0 for none.
  int64_t shared_bytes = 0;
  // Bytes of each (sender, receiver) ring for send/recv (see shm_mailbox.h):
  // a power of two >= 4096, or 0 to turn point-to-point off. Larger
  // messages stream through; the ring only bounds how far a sender runs ahead.
  int64_t mailbox_bytes = 1 << 20;
  // Whether this rank receives messages of 64 KiB and more by reading the
  // sender's buffer directly (process_vm_readv: one copy instead of two).
  // Off, or where the kernel refuses it (other users, Yama's ptrace_scope),
  // they go through the ring; the result is the same.
  bool single_copy = true;
  // The world rank of each group rank, for the flight recorder (its dumps
  // are named by world rank); empty when they are the same.
  std::vector<int> world_ranks;
};

class ShmCommunicator final : public Communicator {
 public:
  // Creates or opens the segment and waits until every rank has attached.
  // Throws CommError naming the ranks that never attached, or Error for bad
  // options or a failing shm_open/mmap.
  explicit ShmCommunicator(ShmCommunicatorOptions options);
  // Lets queued operations finish (each bounded by the timeout), then unmaps.
  ~ShmCommunicator() override;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& group_name() const override;
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

  // This rank's region of options.shared_bytes inside the segment, which
  // every peer can read (read-only: each rank maps its peers' regions so,
  // and a write there faults). all_reduce on data inside it (above the 64 KiB
  // small path, which always copies through the slots), reduce_scatter with
  // input inside it and all_gather with input inside it take the zero-copy
  // path; each rank may use a different offset within its region, but all
  // ranks must take the same path in the same operation (all inside, or all
  // outside, their regions): otherwise the operation fails on every rank
  // with a CommError naming each side's choice. Null if shared_bytes is 0.
  void* shared_buffer() override;
  int64_t shared_buffer_bytes() const override;

  // How many messages this rank has received by single copy (see
  // ShmCommunicatorOptions::single_copy), and how many it has started to
  // read from a sender's memory (failed reads included); for benchmarks and
  // tests.
  int64_t single_copy_messages() const;
  int64_t single_copy_reads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brigade

// Point-to-point messages between the ranks of one shared-memory group: the
// send/recv of ShmCommunicator, which pipeline schedules use to pass
// activations and their gradients between neighbouring stages.
//
// Every ordered pair (src, dst) owns a ring in the segment, a byte stream of
// frames [tag, byte count][payload]:
//
//   [head: bytes written, by src][tail: bytes consumed, by dst][data x ring_bytes]
//
// Each rank runs one progress thread. It writes its queued sends into the
// rings as space allows, and it drains every ring addressed to it all the
// time, into the matching posted recv if there is one, else (once the ring
// is half full, or a recv waits for a message behind it) into a private
// "unexpected" buffer that a later recv copies from. So a send never waits
// for its recv to be posted (only for ring space, which the peer's thread
// frees within microseconds), and any order of sends and recvs among the
// ranks completes: no deadlock from two ranks both sending first.
//
// Messages of 64 KiB and more take a single copy when the receiver can read
// the sender's memory (process_vm_readv, "CMA": the same user, ptrace
// allowed; each rank probes every peer once at start and says on stderr if
// it cannot): the frame then holds only the message's address, the
// receiver's progress thread copies straight from the sender's buffer into
// the recv's, and acknowledges in the ring's control lines, which completes
// the send. Such a message whose recv is not posted within 2 ms is read into
// the private buffer instead, so its send does not wait for the recv either.
//
// Matching is MPI's rule: a recv takes the oldest message from its peer with
// its tag, and the byte counts must agree. Sends to one peer go out in the
// order they were issued; sends and recvs are independent of the group's
// collectives (neither waits for the other).
//
// The caller's thread moves its own operations when it can: posting a send
// or recv runs one pass over the rings (a send whose ring has room goes out
// at once, a recv whose message is there completes), and waiting on one
// polls the rings itself for up to 100 us before it sleeps and leaves the
// rest to the progress thread, which keeps out of the way while a waiter
// polls. So a message whose peer is ready passes without any thread
// hand-off or wake-up.
//
// Each send and recv must finish within timeout_ms of being issued. One that
// does not, or whose peer process has exited, fails with a CommError naming
// the peer; like the collectives, the mailboxes then fail every later send
// and recv, since the ranks no longer agree on the streams (and they read
// nothing more from the rings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "brigade/comm/communicator.h"
#include "brigade/comm/flight_recorder.h"

namespace brigade {

class ShmMailboxes {
 public:
  // The bytes a group of `size` ranks needs in its segment for rings of
  // ring_bytes each (a power of two, at least 4096).
  static int64_t region_bytes(int size, int64_t ring_bytes);

  // region: region_bytes(size, ring_bytes) zeroed bytes inside the mapped
  // segment, at the same offset in every rank. peer_pid(r) is rank r's pid
  // (0 if not attached), for noticing a dead peer and reading its memory.
  // Sends and recvs are recorded under flight_group as the group's
  // point-to-point operations, numbered together in the order they are
  // posted. single_copy false: this rank reads no peer's memory, so every
  // message to it goes through the ring. Starts the progress thread.
  ShmMailboxes(std::string group_name, FlightRecorder::GroupId flight_group, int rank, int size,
               int64_t timeout_ms, std::byte* region, int64_t ring_bytes,
               std::function<uint64_t(int)> peer_pid, bool single_copy = true);
  // Stops the progress thread; sends and recvs still pending fail.
  ~ShmMailboxes();
  ShmMailboxes(const ShmMailboxes&) = delete;
  ShmMailboxes& operator=(const ShmMailboxes&) = delete;

  // `what` names the operation in errors and the flight recorder. The
  // buffer must stay alive and untouched until the Work is done.
  std::shared_ptr<Work> send(const std::byte* data, int64_t bytes, int peer, uint32_t tag,
                             std::string what);
  std::shared_ptr<Work> recv(std::byte* data, int64_t bytes, int peer, uint32_t tag,
                             std::string what);

  // How many messages this rank has received by single copy so far, and how
  // many it has started to read from a sender's memory (failed reads and
  // withdrawn messages included).
  int64_t single_copy_messages() const;
  int64_t single_copy_reads() const;

 private:
  struct Impl;
  // Shared with the polls of the Works handed out (through weak pointers),
  // which may run on a waiter's thread while this object is destroyed.
  std::shared_ptr<Impl> impl_;
};

}  // namespace brigade

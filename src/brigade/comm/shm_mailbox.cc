// One state machine (rings, matching, parking, single copy, and which
// thread drives them): its invariants are read together, hence one file
// past the usual length.
#include "brigade/comm/shm_mailbox.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "brigade/comm/flight_recorder.h"
#include "brigade/comm/shm_primitives.h"
#include "brigade/core/clock.h"

namespace brigade {
namespace {

using shm::AtomicU64;
using shm::kLineBytes;

struct FrameHeader {
  uint64_t tag;  // the message's tag, with kSingleCopyFlag for a single-copy frame
  uint64_t bytes;
};
constexpr int64_t kFrameHeaderBytes = sizeof(FrameHeader);
// A single-copy frame carries, instead of the payload, where the payload
// lies in the sender's address space and the slot its receiver acknowledges.
constexpr uint64_t kSingleCopyFlag = uint64_t{1} << 32;
struct SingleCopyDescriptor {
  uint64_t address;
  uint64_t sequence;  // of single-copy messages from this sender to this receiver
};
constexpr int64_t kSingleCopyFrameBytes = kFrameHeaderBytes + sizeof(SingleCopyDescriptor);
// Messages of at least this many bytes take the single-copy path when the
// receiver can read the sender's memory. Below it, two copies through the
// ring cost less than the system call and the acknowledgement round trip.
constexpr int64_t kSingleCopyBytes = 64 << 10;
// Single-copy messages a sender may have unacknowledged per receiver: each
// owns an acknowledgement slot (sequence % kAckSlots) until acknowledged.
constexpr int64_t kAckSlots = 64;
// An unmatched single-copy message at the front of a ring is pulled into the
// receiver's private buffer (a second copy) once it has waited this long, so
// a send never waits for its recv to be posted for more than about this.
constexpr int64_t kParkAfterNs = 2'000'000;
// What a receiver publishes about reading a sender's memory.
constexpr uint64_t kReadableUnknown = 0, kReadable = 1, kNotReadable = 2;
// An acknowledgement slot's value before sequence s is acknowledged, once it
// is, and once the sender has withdrawn s (its send failed, its buffer may
// be gone): the receiver's and the sender's compare-exchanges from the first
// decide which happened, so a receiver never keeps data read from a buffer
// its sender had already given up.
constexpr uint64_t ack_before(uint64_t s) {
  return s >= kAckSlots ? s - kAckSlots + 1 : 0;
}
constexpr uint64_t ack_done(uint64_t s) {
  return s + 1;
}
constexpr uint64_t ack_withdrawn(uint64_t s) {
  return (s + 1) | (uint64_t{1} << 63);
}
// Per ring: [head][tail][readable][spare][acks x kAckSlots]. The sender
// writes the head, the receiver the tail and `readable`; both may write an
// acknowledgement slot (see ack_before).
constexpr int64_t kRingControlBytes = 4 * kLineBytes + kAckSlots * sizeof(uint64_t);
// Sender and receiver publish their positions every this many bytes, so the
// two copies of a large message overlap instead of taking turns.
constexpr int64_t kPieceBytes = 64 << 10;

// With operations pending: spin, then yield, then nap, each nap twice the
// last up to kLongestNap. Idle, the thread only looks for arriving messages
// every kIdlePoll, so an early sender's frames are drained (never blocking
// it for long) at almost no cost. Why the naps lengthen: a pipeline stage
// has a recv posted ahead for most of its step while its peer computes for
// tens of milliseconds; woken every 50 us, this thread took a third of a
// core from the stage's own compute (tiny, pp 2: 2.6 s of CPU per 6.9 s of
// the training thread's). Naps stay short while a caller sleeps in wait()
// on one of these operations (then only this thread can finish it), so a
// long nap delays no one: what lands meanwhile is a message nobody waits
// for yet.
constexpr int kSpinIterations = 2000;
constexpr int64_t kYieldNs = 1'000'000;
constexpr auto kNap = std::chrono::microseconds(50);
constexpr auto kLongestNap = std::chrono::microseconds(1000);
constexpr auto kIdlePoll = std::chrono::milliseconds(1);
constexpr int64_t kLivenessCheckNs = 20'000'000;
// How long a waiter polls before it sleeps: a ping-pong's round trip is a
// few microseconds, a pipeline stage waiting for its neighbour's compute
// waits milliseconds and should give its core back long before.
constexpr int64_t kWaiterPollNs = 100'000;
// The progress thread stays out of the way while a waiter polls (on two
// cores, two threads spinning over the same rings slow each other): until
// the waiter gives up (it wakes the thread) or, if it finished or was
// descheduled, for at most this long after its last poll.
constexpr int64_t kWaiterActiveNs = 1'000'000;

// One ring: the byte stream from one sender to one receiver.
struct Ring {
  uint64_t* head;  // bytes ever written; stored by the sender (release)
  uint64_t* tail;  // bytes ever consumed; stored by the receiver (release)
  // kReadable* : whether the receiver can read the sender's memory (CMA).
  // The ring from a rank to itself carries no messages: its head holds the
  // address of the rank's probe word, its tail the word's value.
  uint64_t* readable;
  uint64_t* acks;  // slot sequence % kAckSlots holds sequence + 1 once copied
  std::byte* data;
  int64_t capacity;

  // Copies n bytes to/from stream position `position`, wrapping around.
  void write(uint64_t position, const std::byte* from, int64_t n) const {
    const int64_t offset = static_cast<int64_t>(position % capacity);
    const int64_t first = std::min(n, capacity - offset);
    std::memcpy(data + offset, from, first);
    std::memcpy(data, from + first, n - first);
  }
  void read(uint64_t position, std::byte* to, int64_t n) const {
    const int64_t offset = static_cast<int64_t>(position % capacity);
    const int64_t first = std::min(n, capacity - offset);
    std::memcpy(to, data + offset, first);
    std::memcpy(to + first, data, n - first);
  }
};

// A send or recv from the caller until its Work is finished.
struct Pending {
  bool is_send = false;
  std::byte* data = nullptr;
  int64_t bytes = 0;
  int peer = 0;
  uint32_t tag = 0;
  std::string what;
  uint64_t record_id = 0;
  int64_t deadline_ns = 0;
  std::shared_ptr<Work> work;
  int64_t moved = 0;      // sends: stream bytes written, frame header included
  uint64_t sequence = 0;  // single-copy sends: the acknowledgement awaited
};

// A message that arrived before its recv was posted.
struct Unexpected {
  int src = 0;
  uint32_t tag = 0;
  std::vector<std::byte> data;
  int64_t received = 0;
  bool complete() const { return received == static_cast<int64_t>(data.size()); }
};

// The frame a receiver is in the middle of, per sender.
struct Incoming {
  bool active = false;
  int64_t bytes = 0;
  int64_t received = 0;
  std::shared_ptr<Pending> recv;           // the matched recv, or
  std::shared_ptr<Unexpected> unexpected;  // where it is parked
};

std::string rank_or_none(uint64_t pid) {
  return pid == 0 ? "not attached" : fmt::format("pid {}", pid);
}

}  // namespace

struct ShmMailboxes::Impl : std::enable_shared_from_this<Impl> {
  Impl(std::string group_name, FlightRecorder::GroupId flight_group, int rank, int size,
       int64_t timeout_ms, std::byte* region, int64_t ring_bytes,
       std::function<uint64_t(int)> peer_pid, bool single_copy);

  Ring ring(int src, int dst) const {
    std::byte* base =
        region + (static_cast<int64_t>(src) * size + dst) * (kRingControlBytes + ring_bytes);
    return Ring{reinterpret_cast<uint64_t*>(base),
                reinterpret_cast<uint64_t*>(base + kLineBytes),
                reinterpret_cast<uint64_t*>(base + 2 * kLineBytes),
                reinterpret_cast<uint64_t*>(base + 4 * kLineBytes),
                base + kRingControlBytes,
                ring_bytes};
  }

  std::shared_ptr<Work> post(bool is_send, std::byte* data, int64_t bytes, int peer, uint32_t tag,
                             std::string what);
  void run();
  // One pass of the thread waiting for `mine`, unless another thread is in
  // the middle of one.
  void poll(Work& mine);
  // With `state` held: accepts posted operations, moves data, checks
  // deadlines; returns whether anything moved. A failure fails everything.
  bool pass();
  // With `state` held: whether any operation is under way.
  bool busy() const;
  // One pass over the rings; returns whether anything moved.
  bool progress();
  bool progress_sends(int dst);
  bool drain(int src);
  // Publishes this rank's probe word, then (each pass, until every peer's
  // probe is there) whether it can read each peer's memory.
  void publish_probe();
  void probe_peers();
  // Copies `bytes` from `address` in rank src's memory; returns 0, or the
  // errno of the read that failed.
  int read_peer(int src, uint64_t address, std::byte* to, int64_t bytes);
  // Completes this rank's single-copy sends that their receivers acknowledged.
  bool collect_acks(int dst);
  bool accept_posted();  // whether there was anything to accept
  void match_recv(const std::shared_ptr<Pending>& recv);
  // Consumes the single-copy frame at the front of src's ring: reads the
  // message into `recv` (or, if that is recvs.end(), into a parked buffer)
  // and acknowledges it.
  void take_single_copy(int src, uint32_t tag, int64_t bytes,
                        std::list<std::shared_ptr<Pending>>::iterator recv);
  void deliver(Pending& recv, const std::byte* from);
  void complete(Pending& op);
  void check_deadlines();
  [[noreturn]] void fail(const Pending& op, const std::string& reason);
  void fail_everything(const std::string& reason, std::vector<int> peers);

  const std::string group_name;
  const FlightRecorder::GroupId flight_group;
  const int rank;
  const int size;
  const int64_t timeout_ms;
  std::byte* const region;
  const int64_t ring_bytes;
  const std::function<uint64_t(int)> peer_pid;
  const bool single_copy;
  uint64_t probe_word = 0;  // peers read it to learn whether they can read us
  std::atomic<int64_t> single_copy_received{0};
  std::atomic<int64_t> single_copy_reads{0};

  std::mutex mutex;
  std::condition_variable posted_cv;
  std::vector<std::shared_ptr<Pending>> posted;  // handed over by callers
  uint64_t next_seq = 0;                         // of point-to-point records
  bool stopping = false;
  std::thread thread;
  std::atomic<int64_t> last_poll_ns{0};  // when a waiter last polled
  std::atomic<bool> waiter_polling{false};
  // Callers asleep in Work::wait() on an operation of these mailboxes: only
  // this thread can finish it then, so it naps short.
  std::atomic<int> sleeping_waiters{0};
  bool waiter_active() const {
    return waiter_polling.load(std::memory_order_relaxed) &&
           now_ns() - last_poll_ns.load(std::memory_order_relaxed) < kWaiterActiveNs;
  }

  // Everything below is touched only with `state` held, by the progress
  // thread or a caller's thread (posting or waiting). Lock order: state,
  // then mutex.
  std::mutex state;
  bool stopped = false;  // the progress thread has ended: the rings may be gone
  std::vector<std::deque<std::shared_ptr<Pending>>> sends;  // per destination, in order
  std::list<std::shared_ptr<Pending>> recvs;                // posted, not yet matched
  std::list<std::shared_ptr<Unexpected>> unexpected;        // arrival order
  std::vector<Incoming> incoming;                           // per source
  std::vector<uint64_t> head;                               // my write position per destination
  std::vector<uint64_t> tail;                               // my read position per source
  // Single-copy sends written into the ring and awaiting the receiver's
  // acknowledgement, per destination, and the next sequence number.
  std::vector<std::deque<std::shared_ptr<Pending>>> awaiting_ack;
  std::vector<uint64_t> next_sequence;
  std::vector<int64_t> unmatched_since_ns;  // per source: an unmatched single-copy frame waits
  std::vector<bool> probed;                 // per source: readable verdict published
  int unprobed = 0;
  int64_t next_probe_liveness_ns = 0;  // when to look whether an unprobed peer is gone
  std::string broken;
  std::vector<int> broken_peers;
  int64_t next_liveness_ns = 0;
};

ShmMailboxes::Impl::Impl(std::string group, FlightRecorder::GroupId flight_group_, int rank_,
                         int size_, int64_t timeout, std::byte* base, int64_t ring,
                         std::function<uint64_t(int)> pid, bool single_copy_)
    : group_name(std::move(group)),
      flight_group(flight_group_),
      rank(rank_),
      size(size_),
      timeout_ms(timeout),
      region(base),
      ring_bytes(ring),
      peer_pid(std::move(pid)),
      single_copy(single_copy_),
      sends(size_),
      incoming(size_),
      head(size_, 0),
      tail(size_, 0),
      awaiting_ack(size_),
      next_sequence(size_, 0),
      unmatched_since_ns(size_, 0),
      probed(size_, false),
      unprobed(size_ - 1) {
  probed[rank_] = true;
}

int64_t ShmMailboxes::single_copy_messages() const {
  return impl_->single_copy_received.load(std::memory_order_relaxed);
}

int64_t ShmMailboxes::single_copy_reads() const {
  return impl_->single_copy_reads.load(std::memory_order_relaxed);
}

int64_t ShmMailboxes::region_bytes(int size, int64_t ring_bytes) {
  return static_cast<int64_t>(size) * size * (kRingControlBytes + ring_bytes);
}

ShmMailboxes::ShmMailboxes(std::string group_name, FlightRecorder::GroupId flight_group, int rank,
                           int size, int64_t timeout_ms, std::byte* region, int64_t ring_bytes,
                           std::function<uint64_t(int)> peer_pid, bool single_copy) {
  if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0) {
    throw_error("shm group '{}': mailbox ring of {} bytes must be a power of two >= 4096",
                group_name, ring_bytes);
  }
  impl_ = std::make_shared<Impl>(std::move(group_name), flight_group, rank, size, timeout_ms,
                                 region, ring_bytes, std::move(peer_pid), single_copy);
  impl_->publish_probe();
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

ShmMailboxes::~ShmMailboxes() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->posted_cv.notify_all();
  impl_->thread.join();
}

std::shared_ptr<Work> ShmMailboxes::send(const std::byte* data, int64_t bytes, int peer,
                                         uint32_t tag, std::string what) {
  return impl_->post(true, const_cast<std::byte*>(data), bytes, peer, tag, std::move(what));
}

std::shared_ptr<Work> ShmMailboxes::recv(std::byte* data, int64_t bytes, int peer, uint32_t tag,
                                         std::string what) {
  return impl_->post(false, data, bytes, peer, tag, std::move(what));
}

std::shared_ptr<Work> ShmMailboxes::Impl::post(bool is_send, std::byte* data, int64_t bytes,
                                               int peer, uint32_t tag, std::string what) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw_error("shm {} on group '{}' (rank {} of {}): peer {} must be another rank of the group",
                what, group_name, rank, size, peer);
  }
  auto op = std::make_shared<Pending>();
  op->is_send = is_send;
  op->data = data;
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->what = std::move(what);
  op->deadline_ns = now_ns() + timeout_ms * 1'000'000;
  op->work = std::make_shared<Work>();
  op->work->set_poll(
      // The Work outlives the polls of its own wait().
      [weak = weak_from_this(), work = op->work.get()] {
        if (const std::shared_ptr<Impl> impl = weak.lock()) impl->poll(*work);
      },
      kWaiterPollNs,
      [weak = weak_from_this()](bool asleep) {
        const std::shared_ptr<Impl> impl = weak.lock();
        if (!impl) return;
        if (!asleep) {
          impl->sleeping_waiters.fetch_sub(1, std::memory_order_relaxed);
          return;
        }
        impl->sleeping_waiters.fetch_add(1, std::memory_order_relaxed);
        impl->waiter_polling.store(false, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(impl->mutex);
        impl->posted_cv.notify_one();
      });
  {
    std::lock_guard<std::mutex> lock(mutex);
    op->record_id = FlightRecorder::global().scheduled(flight_group, RecordKind::kPointToPoint,
                                                       next_seq++, "shm", op->what, bytes);
    posted.push_back(op);
  }
  // Moved at once on this thread where it can be (a send whose ring has
  // room, a recv whose message is there). The progress thread is not woken:
  // it looks within kIdlePoll, and a waiter polls for itself meanwhile.
  std::unique_lock<std::mutex> lock(state, std::try_to_lock);
  if (lock.owns_lock() && !stopped) pass();
  return op->work;
}

void ShmMailboxes::Impl::poll(Work& mine) {
  std::unique_lock<std::mutex> lock(state, std::try_to_lock);
  if (!lock.owns_lock() || stopped) return;
  last_poll_ns.store(now_ns(), std::memory_order_relaxed);
  waiter_polling.store(true, std::memory_order_relaxed);
  pass();
  if (mine.test()) {
    // Its waiter leaves with this pass: what it leaves behind (recvs posted
    // ahead, acknowledgements, a stream) is the thread's again at once, not
    // once the waiter's last poll has aged.
    waiter_polling.store(false, std::memory_order_relaxed);
    if (busy()) {
      std::lock_guard<std::mutex> posted_lock(mutex);
      posted_cv.notify_one();
    }
  }
}

bool ShmMailboxes::Impl::pass() {
  bool moved = false;
  try {
    moved = accept_posted();
    moved |= progress();
    check_deadlines();
  } catch (const CommError& e) {
    fail_everything(e.what(), e.peer_ranks());
  }
  return moved;
}

bool ShmMailboxes::Impl::busy() const {
  // Unprobed peers count: a sender of a large message waits for the verdict.
  // Broken, nothing moves any more (see progress()).
  if (!broken.empty()) return false;
  return unprobed > 0 || !recvs.empty() ||
         std::any_of(sends.begin(), sends.end(), [](auto& q) { return !q.empty(); }) ||
         std::any_of(awaiting_ack.begin(), awaiting_ack.end(),
                     [](auto& q) { return !q.empty(); }) ||
         std::any_of(incoming.begin(), incoming.end(), [](auto& f) { return f.active; });
}

void ShmMailboxes::Impl::run() {
  // Spin while an exchange is live; back off only once nothing has moved
  // for a while (a peer that is computing, stopped or gone).
  int spins = 0;
  int64_t quiet_since_ns = 0;
  std::chrono::microseconds nap = kNap;
  bool was_busy = true;  // until the first pass has probed the peers
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // Nothing pending, or a waiter moving things itself: give the core
      // back to the workers' compute.
      if (((!was_busy && posted.empty()) || waiter_active()) && !stopping) {
        posted_cv.wait_for(lock, kIdlePoll);
      }
      if (stopping) break;
    }
    if (waiter_active()) continue;
    bool moved = false;
    {
      std::lock_guard<std::mutex> state_lock(state);
      moved = pass();
      was_busy = busy();
    }
    if (moved) {
      spins = 0;
      quiet_since_ns = 0;
    } else if (spins < kSpinIterations) {
      ++spins;
      shm::cpu_relax();
    } else {
      const int64_t now = now_ns();
      if (quiet_since_ns == 0) quiet_since_ns = now;
      if (now - quiet_since_ns < kYieldNs) {
        ::sched_yield();
        nap = kNap;
      } else {
        // On the condition variable, so that a waiter giving up its polls
        // (it notifies) ends the nap at once.
        std::unique_lock<std::mutex> lock(mutex);
        const bool woken = !stopping && posted_cv.wait_for(lock, nap) == std::cv_status::no_timeout;
        const bool someone_asleep = sleeping_waiters.load(std::memory_order_relaxed) > 0;
        nap = woken || someone_asleep ? kNap : std::min(2 * nap, kLongestNap);
      }
    }
  }
  std::lock_guard<std::mutex> state_lock(state);
  fail_everything(fmt::format("the communicator of group '{}' was destroyed", group_name), {});
  stopped = true;
}

bool ShmMailboxes::Impl::accept_posted() {
  std::vector<std::shared_ptr<Pending>> taken;
  {
    std::lock_guard<std::mutex> lock(mutex);
    taken.swap(posted);
  }
  for (auto& op : taken) {
    if (!broken.empty()) {
      FlightRecorder::global().failed(op->record_id, "not run: the mailboxes failed earlier");
      op->work->finish(std::make_exception_ptr(CommError(
          fmt::format("shm {} on group '{}' (rank {} of {}) not run: point-to-point failed "
                      "earlier: {}",
                      op->what, group_name, rank, size, broken),
          broken_peers)));
      continue;
    }
    FlightRecorder::global().started(op->record_id);
    if (op->is_send) {
      sends[op->peer].push_back(op);
    } else {
      match_recv(op);
    }
  }
  return !taken.empty();
}

bool ShmMailboxes::Impl::progress() {
  // Broken, the rings are left as they are: every operation has failed, a
  // frame cut off in the middle would be misread, and a single-copy frame
  // that failed would be read (and fail) again on every pass.
  if (!broken.empty()) return false;
  if (unprobed > 0) probe_peers();
  bool moved = false;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    moved |= progress_sends(peer);
    moved |= collect_acks(peer);
    moved |= drain(peer);
  }
  return moved;
}

void ShmMailboxes::Impl::publish_probe() {
  probe_word = (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(now_ns()) ^ 1;
  const Ring self = ring(rank, rank);
  AtomicU64(*self.tail).store(probe_word, std::memory_order_relaxed);
  AtomicU64(*self.head).store(reinterpret_cast<uintptr_t>(&probe_word), std::memory_order_release);
}

void ShmMailboxes::Impl::probe_peers() {
  const int64_t now = now_ns();
  const bool check_liveness = now >= next_probe_liveness_ns;
  if (check_liveness) next_probe_liveness_ns = now + kLivenessCheckNs;
  for (int p = 0; p < size; ++p) {
    if (probed[p]) continue;
    uint64_t verdict = kNotReadable;
    const Ring theirs = ring(p, p);
    const uint64_t address =
        single_copy ? AtomicU64(*theirs.head).load(std::memory_order_acquire) : 0;
    const uint64_t pid = peer_pid(p);
    if (single_copy && (address == 0 || pid == 0)) {
      // Not published yet: look again next pass, unless the peer died before
      // building its mailboxes (it sends nothing, and waiting for it would
      // keep this rank busy for good).
      if (!check_liveness || shm::process_exists(pid)) continue;
    } else if (single_copy) {
      const uint64_t expected = AtomicU64(*theirs.tail).load(std::memory_order_relaxed);
      uint64_t seen = 0;
      iovec local{&seen, sizeof(seen)};
      iovec remote{reinterpret_cast<void*>(address), sizeof(seen)};
      const ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
      if (n == static_cast<ssize_t>(sizeof(seen)) && seen == expected) {
        verdict = kReadable;
      } else if (n < 0 && errno == ESRCH) {
        // Gone already (it sends nothing more): no verdict on the machine.
      } else {
        const std::string why = n < 0 ? std::strerror(errno) : "read the wrong value";
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
          std::fprintf(stderr,
                       "brigade: shm group '%s': rank %d cannot read rank %d's memory with "
                       "process_vm_readv (%s); send/recv of %lld bytes and more take the "
                       "two-copy path through the ring. Single copy needs the ranks to run as "
                       "one user with ptrace allowed between them "
                       "(/proc/sys/kernel/yama/ptrace_scope 0, or CAP_SYS_PTRACE).\n",
                       group_name.c_str(), rank, p, why.c_str(),
                       static_cast<long long>(kSingleCopyBytes));
        }
      }
    }
    AtomicU64(*ring(p, rank).readable).store(verdict, std::memory_order_release);
    probed[p] = true;
    --unprobed;
  }
}

int ShmMailboxes::Impl::read_peer(int src, uint64_t address, std::byte* to, int64_t bytes) {
  single_copy_reads.fetch_add(1, std::memory_order_relaxed);
  const auto pid = static_cast<pid_t>(peer_pid(src));
  int64_t done = 0;
  while (done < bytes) {
    iovec local{to + done, static_cast<size_t>(bytes - done)};
    iovec remote{reinterpret_cast<void*>(address + static_cast<uint64_t>(done)),
                 static_cast<size_t>(bytes - done)};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += n;
      continue;
    }
    const int error = n < 0 ? errno : EFAULT;
    if (error != EINTR) return error;
  }
  return 0;
}

bool ShmMailboxes::Impl::collect_acks(int dst) {
  auto& queue = awaiting_ack[dst];
  if (queue.empty()) return false;
  const Ring out = ring(rank, dst);
  bool moved = false;
  // The receiver may take them in any order (by tag).
  for (auto it = queue.begin(); it != queue.end();) {
    const uint64_t s = (*it)->sequence;
    if (AtomicU64(out.acks[s % kAckSlots]).load(std::memory_order_acquire) == ack_done(s)) {
      complete(**it);
      it = queue.erase(it);
      moved = true;
    } else {
      ++it;
    }
  }
  return moved;
}

bool ShmMailboxes::Impl::progress_sends(int dst) {
  const Ring out = ring(rank, dst);
  bool moved = false;
  while (!sends[dst].empty()) {
    Pending& op = *sends[dst].front();
    const uint64_t consumed = AtomicU64(*out.tail).load(std::memory_order_acquire);
    int64_t space = ring_bytes - static_cast<int64_t>(head[dst] - consumed);
    const uint64_t readable = op.moved == 0 && op.bytes >= kSingleCopyBytes
                                  ? AtomicU64(*out.readable).load(std::memory_order_acquire)
                                  : kNotReadable;
    // The receiver says within its first pass; until then, wait, so which
    // path a message takes does not depend on timing.
    if (readable == kReadableUnknown) break;
    if (readable == kReadable) {
      // Single copy: only where the message is goes through the ring; the
      // receiver reads it from this process and acknowledges.
      if (space < kSingleCopyFrameBytes ||
          static_cast<int64_t>(awaiting_ack[dst].size()) >= kAckSlots) {
        break;
      }
      op.sequence = next_sequence[dst]++;
      const struct {
        FrameHeader header;
        SingleCopyDescriptor descriptor;
      } frame{{op.tag | kSingleCopyFlag, static_cast<uint64_t>(op.bytes)},
              {reinterpret_cast<uintptr_t>(op.data), op.sequence}};
      static_assert(sizeof(frame) == kSingleCopyFrameBytes);
      out.write(head[dst], reinterpret_cast<const std::byte*>(&frame), kSingleCopyFrameBytes);
      head[dst] += kSingleCopyFrameBytes;
      AtomicU64(*out.head).store(head[dst], std::memory_order_release);
      awaiting_ack[dst].push_back(std::move(sends[dst].front()));
      sends[dst].pop_front();
      moved = true;
      continue;
    }
    if (op.moved < kFrameHeaderBytes) {
      // The header goes in whole, so the receiver never sees half of one.
      if (space < kFrameHeaderBytes) break;
      const FrameHeader frame{op.tag, static_cast<uint64_t>(op.bytes)};
      out.write(head[dst], reinterpret_cast<const std::byte*>(&frame), kFrameHeaderBytes);
      head[dst] += kFrameHeaderBytes;
      op.moved = kFrameHeaderBytes;
      space -= kFrameHeaderBytes;
      moved = true;
    }
    for (;;) {
      const int64_t sent = op.moved - kFrameHeaderBytes;
      const int64_t n = std::min({space, op.bytes - sent, kPieceBytes});
      if (n <= 0) break;
      out.write(head[dst], op.data + sent, n);
      head[dst] += n;
      op.moved += n;
      space -= n;
      moved = true;
      AtomicU64(*out.head).store(head[dst], std::memory_order_release);
    }
    AtomicU64(*out.head).store(head[dst], std::memory_order_release);
    if (op.moved < kFrameHeaderBytes + op.bytes) break;  // the ring is full
    complete(op);
    sends[dst].pop_front();
  }
  return moved;
}

bool ShmMailboxes::Impl::drain(int src) {
  const Ring in = ring(src, rank);
  Incoming& frame = incoming[src];
  bool moved = false;
  for (;;) {
    const uint64_t written = AtomicU64(*in.head).load(std::memory_order_acquire);
    const int64_t available = static_cast<int64_t>(written - tail[src]);
    if (!frame.active) {
      if (available < kFrameHeaderBytes) break;
      FrameHeader header{};
      in.read(tail[src], reinterpret_cast<std::byte*>(&header), kFrameHeaderBytes);
      const auto tag = static_cast<uint32_t>(header.tag);
      const bool single = (header.tag & kSingleCopyFlag) != 0;
      if (single && available < kSingleCopyFrameBytes) break;
      // Older parked messages of this (src, tag) come first, so a recv only
      // takes a frame straight off the ring when none are parked.
      const bool parked = std::any_of(unexpected.begin(), unexpected.end(),
                                      [&](auto& u) { return u->src == src && u->tag == tag; });
      auto recv = parked ? recvs.end() : std::find_if(recvs.begin(), recvs.end(), [&](auto& r) {
        return r->peer == src && r->tag == tag;
      });
      // An unmatched message stays in the ring (so its recv, posted a moment
      // later, copies it once) unless it holds up the stream: the ring is
      // half full, or a recv waits for a message behind it.
      const bool blocking =
          available >= ring_bytes / 2 ||
          std::any_of(recvs.begin(), recvs.end(), [&](auto& r) { return r->peer == src; });
      if (recv == recvs.end() && !blocking) {
        if (!single) break;
        // Its sender waits for the copy: park it once it has waited long
        // enough that its recv is evidently not about to be posted.
        const int64_t now = now_ns();
        if (unmatched_since_ns[src] == 0) unmatched_since_ns[src] = now;
        if (now - unmatched_since_ns[src] < kParkAfterNs) break;
      }
      if (single) {
        take_single_copy(src, tag, static_cast<int64_t>(header.bytes), recv);
        moved = true;
        continue;
      }
      tail[src] += kFrameHeaderBytes;
      frame = Incoming{true, static_cast<int64_t>(header.bytes), 0, nullptr, nullptr};
      if (recv != recvs.end()) {
        frame.recv = *recv;
        recvs.erase(recv);
        if (frame.recv->bytes != frame.bytes) {
          fail(*frame.recv,
               fmt::format("rank {} sent a message of {} bytes with this tag", src, frame.bytes));
        }
      } else {
        frame.unexpected = std::make_shared<Unexpected>();
        frame.unexpected->src = src;
        frame.unexpected->tag = tag;
        frame.unexpected->data.resize(static_cast<size_t>(frame.bytes));
        unexpected.push_back(frame.unexpected);
      }
      moved = true;
      continue;
    }
    const int64_t n = std::min({available, frame.bytes - frame.received, kPieceBytes});
    if (n > 0) {
      std::byte* to = frame.recv ? frame.recv->data : frame.unexpected->data.data();
      in.read(tail[src], to + frame.received, n);
      tail[src] += n;
      frame.received += n;
      AtomicU64(*in.tail).store(tail[src], std::memory_order_release);
      moved = true;
    }
    if (frame.received < frame.bytes) break;
    if (frame.recv) {
      complete(*frame.recv);
    } else {
      frame.unexpected->received = frame.bytes;
      // A recv posted while this message was still arriving waits for it.
      auto recv = std::find_if(recvs.begin(), recvs.end(), [&](auto& r) {
        return r->peer == src && r->tag == frame.unexpected->tag;
      });
      if (recv != recvs.end()) {
        auto waiting = *recv;
        recvs.erase(recv);
        match_recv(waiting);
      }
    }
    frame = Incoming{};
  }
  return moved;
}

void ShmMailboxes::Impl::take_single_copy(int src, uint32_t tag, int64_t bytes,
                                          std::list<std::shared_ptr<Pending>>::iterator recv) {
  const Ring in = ring(src, rank);
  SingleCopyDescriptor descriptor{};
  in.read(tail[src] + kFrameHeaderBytes, reinterpret_cast<std::byte*>(&descriptor),
          sizeof(descriptor));
  std::shared_ptr<Unexpected> parked;
  std::byte* to = nullptr;
  const Pending* op = nullptr;
  if (recv != recvs.end()) {
    op = recv->get();
    if (op->bytes != bytes) {
      fail(*op, fmt::format("rank {} sent a message of {} bytes with this tag", src, bytes));
    }
    to = op->data;
  } else {
    parked = std::make_shared<Unexpected>();
    parked->src = src;
    parked->tag = tag;
    parked->data.resize(static_cast<size_t>(bytes));
    to = parked->data.data();
  }
  const int error = read_peer(src, descriptor.address, to, bytes);
  const uint64_t s = descriptor.sequence;
  AtomicU64 ack(in.acks[s % kAckSlots]);
  uint64_t expected = ack_before(s);
  // A sender withdraws before its buffer may go, so a read that failed on a
  // withdrawn message failed because of it.
  const bool withdrawn =
      error == 0 ? !ack.compare_exchange_strong(expected, ack_done(s), std::memory_order_acq_rel)
                 : ack.load(std::memory_order_acquire) == ack_withdrawn(s);
  if (error != 0 || withdrawn) {
    const uint64_t pid = peer_pid(src);
    const std::string reason =
        withdrawn
            ? fmt::format("rank {} withdrew its message of {} bytes (its send failed)", src, bytes)
        : error == ESRCH || !shm::process_exists(pid)
            ? fmt::format("peer rank {} ({}) has exited", src, rank_or_none(pid))
            : fmt::format("cannot read rank {}'s message of {} bytes (process_vm_readv: {})", src,
                          bytes, std::strerror(error));
    if (op != nullptr) fail(*op, reason);
    throw CommError(fmt::format("shm point-to-point on group '{}' (rank {} of {}) failed: {}",
                                group_name, rank, size, reason),
                    {src});
  }
  tail[src] += kSingleCopyFrameBytes;
  AtomicU64(*in.tail).store(tail[src], std::memory_order_release);
  unmatched_since_ns[src] = 0;
  single_copy_received.fetch_add(1, std::memory_order_relaxed);
  if (op != nullptr) {
    std::shared_ptr<Pending> done = *recv;
    recvs.erase(recv);
    complete(*done);
  } else {
    parked->received = bytes;
    unexpected.push_back(std::move(parked));
  }
}

void ShmMailboxes::Impl::match_recv(const std::shared_ptr<Pending>& recv) {
  auto message = std::find_if(unexpected.begin(), unexpected.end(),
                              [&](auto& u) { return u->src == recv->peer && u->tag == recv->tag; });
  if (message == unexpected.end() || !(*message)->complete()) {
    recvs.push_back(recv);  // matched when its message arrives
    return;
  }
  if (static_cast<int64_t>((*message)->data.size()) != recv->bytes) {
    fail(*recv, fmt::format("rank {} sent a message of {} bytes with this tag", recv->peer,
                            (*message)->data.size()));
  }
  if (recv->bytes > 0) {  // an empty message's buffers may be null
    std::memcpy(recv->data, (*message)->data.data(), static_cast<size_t>(recv->bytes));
  }
  unexpected.erase(message);
  complete(*recv);
}

void ShmMailboxes::Impl::complete(Pending& op) {
  FlightRecorder::global().completed(op.record_id);
  op.work->finish();
}

void ShmMailboxes::Impl::check_deadlines() {
  const int64_t now = now_ns();
  const bool check_liveness = now >= next_liveness_ns;
  if (check_liveness) next_liveness_ns = now + kLivenessCheckNs;
  auto check = [&](const Pending& op) {
    if (now > op.deadline_ns) {
      fail(op, fmt::format("timed out after {} ms: peer rank {} did not {} (stopped, hung, or "
                           "not calling the matching {})",
                           timeout_ms, op.peer, op.is_send ? "take the data" : "send it",
                           op.is_send ? "recv" : "send"));
    }
    if (check_liveness && !shm::process_exists(peer_pid(op.peer))) {
      fail(op,
           fmt::format("peer rank {} ({}) has exited", op.peer, rank_or_none(peer_pid(op.peer))));
    }
  };
  for (const auto& queue : sends) {
    for (const auto& op : queue) check(*op);
  }
  for (const auto& queue : awaiting_ack) {
    for (const auto& op : queue) check(*op);
  }
  for (const auto& op : recvs) check(*op);
  for (const Incoming& frame : incoming) {
    if (frame.recv) check(*frame.recv);
  }
}

void ShmMailboxes::Impl::fail(const Pending& op, const std::string& reason) {
  throw CommError(fmt::format("shm {} on group '{}' (rank {} of {}) failed: {}", op.what,
                              group_name, rank, size, reason),
                  {op.peer});
}

void ShmMailboxes::Impl::fail_everything(const std::string& reason, std::vector<int> peers) {
  const bool first = broken.empty();
  if (first) {
    broken = reason;
    broken_peers = peers;
  }
  std::vector<std::shared_ptr<Pending>> failing;
  for (auto& queue : sends) {
    failing.insert(failing.end(), queue.begin(), queue.end());
    queue.clear();
  }
  for (int dst = 0; dst < size; ++dst) {
    for (auto& op : awaiting_ack[dst]) {
      // Taken back before its Work fails (and its buffer may go): a receiver
      // that reads it anyway finds out. One the receiver has acknowledged
      // meanwhile did arrive.
      uint64_t expected = ack_before(op->sequence);
      if (AtomicU64(ring(rank, dst).acks[op->sequence % kAckSlots])
              .compare_exchange_strong(expected, ack_withdrawn(op->sequence),
                                       std::memory_order_acq_rel)) {
        failing.push_back(op);
      } else {
        complete(*op);
      }
    }
    awaiting_ack[dst].clear();
  }
  failing.insert(failing.end(), recvs.begin(), recvs.end());
  recvs.clear();
  for (Incoming& frame : incoming) {
    if (frame.recv) failing.push_back(frame.recv);
    frame = Incoming{};
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    failing.insert(failing.end(), posted.begin(), posted.end());
    posted.clear();
  }
  for (auto& op : failing) {
    FlightRecorder::global().failed(op->record_id, reason);
    op->work->finish(std::make_exception_ptr(CommError(reason, peers)));
  }
  if (first && !peers.empty()) {
    try {
      FlightRecorder::global().dump_to_run_dir();
    } catch (const std::exception&) {
      // The communication error is what callers must see.
    }
  }
}

}  // namespace brigade

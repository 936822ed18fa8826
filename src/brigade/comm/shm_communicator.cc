#include "brigade/comm/shm_communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "brigade/comm/op_description.h"
#include "brigade/comm/op_queue.h"
#include "brigade/comm/shm_mailbox.h"
#include "brigade/comm/shm_op_shape.h"
#include "brigade/comm/shm_primitives.h"
#include "brigade/core/clock.h"
#include "brigade/core/pages.h"

namespace brigade {
namespace {

constexpr uint64_t kMagic = 0x326d6873'67697262;  // "brigshm2": RankControl holds op shapes
using shm::AtomicU64;
using shm::Collective;
using shm::cpu_relax;
using shm::kLineBytes;
using shm::OpShape;
using shm::process_exists;
using shm::Protocol;

constexpr int64_t kSlotAlignBytes = 4096;
// Waiting: this many pause instructions (a few microseconds), then yield the
// core for up to kYieldNs, then nap kNapNs at a time. Latency-critical small
// collectives finish while spinning; a stopped peer costs only naps.
constexpr int kSpinIterations = 4000;
constexpr int64_t kYieldNs = 1'000'000;
constexpr auto kNap = std::chrono::microseconds(50);
// How often a waiting rank checks that the peers it waits for still exist.
constexpr int64_t kLivenessCheckNs = 20'000'000;
// All-reduces up to this size take the one-synchronisation small path
// (small_all_reduce_start/finish), and the caller's thread tries them inline
// for up to kInlinePollNs before handing the rest to the communication
// thread. A hand-off costs two thread wake-ups, over 100 us on a busy VM, and
// one rank's hand-off makes its next call late for the peers, whose own
// attempts then run out: the budget must outlast a short preemption of a
// peer, or the ranks fall into that cycle (measured: 0.6% hand-offs with
// 50 us, 2x the mean latency; none with 1 ms). What a caller can lose to a
// late peer is that 1 ms, against training steps of hundreds.
constexpr int64_t kSmallAllReduceBytes = 64 << 10;
constexpr int64_t kInlinePollNs = 1'000'000;
// Within that budget, spin this long before yielding the core between looks,
// so ranks that share a core (more ranks than cores) still get to arrive.
constexpr int64_t kInlineSpinNs = 20'000;

struct alignas(kLineBytes) Header {
  uint64_t magic;  // stored last by the creator (release): the rest is valid
  uint64_t world_size;
  uint64_t slot_bytes;
  uint64_t creator_pid;
  uint64_t attached;  // ranks that have mapped the segment
};

struct alignas(kLineBytes) RankControl {
  uint64_t phase;  // the last synchronisation phase this rank arrived at
  uint64_t pid;    // 0 until the rank attaches
  // For a zero-copy operation: where in its shared region this rank's buffer
  // starts, published before the operation's first synchronisation.
  uint64_t shared_offset;
  // The shape of what this rank runs at a phase (shm_op_shape.h: the word,
  // the count), stored before arriving there, in the phase's parity: a peer
  // reads it after seeing the phase and before arriving at the next one,
  // and until then this rank can get one phase further at most (the other
  // parity), so the pair being read is never overwritten.
  uint64_t shape[2][2];
};

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// The elements [begin, end) of an n-element chunk that `owner` reduces: an
// even split in whole 128-byte lines, so no two owners write the same line.
std::pair<int64_t, int64_t> share_of(int64_t n, int owner, int size, int64_t elem_bytes) {
  const int64_t unit = kLineBytes / elem_bytes;
  const int64_t units = (n + unit - 1) / unit;
  const int64_t base = units / size;
  const int64_t extra = units % size;
  const int64_t begin = owner * base + std::min<int64_t>(owner, extra);
  const int64_t end = begin + base + (owner < extra ? 1 : 0);
  return {std::min(begin * unit, n), std::min(end * unit, n)};
}

// dst[0, n) <- op(dst, sources[0], sources[1], ...). Blocked so a block of
// dst stays in L1 while every source streams through it once.
template <typename T>
void reduce_typed(T* dst, const std::vector<const std::byte*>& sources, int64_t n, ReduceOp op,
                  int size) {
  constexpr int64_t kBlock = 2048;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    T* out = dst + b;
    for (const std::byte* source : sources) {
      const T* in = reinterpret_cast<const T*>(source) + b;
      if (op == ReduceOp::kMax) {
        for (int64_t i = 0; i < m; ++i) out[i] = std::max(out[i], in[i]);
      } else {
        for (int64_t i = 0; i < m; ++i) out[i] += in[i];
      }
    }
    if (op == ReduceOp::kAvg) {
      const T divisor = static_cast<T>(size);
      for (int64_t i = 0; i < m; ++i) out[i] /= divisor;
    }
  }
}

void reduce_into(std::byte* dst, const std::vector<const std::byte*>& sources, int64_t n,
                 DType dtype, ReduceOp op, int size) {
  switch (dtype) {
    case DType::kF32:
      return reduce_typed(reinterpret_cast<float*>(dst), sources, n, op, size);
    case DType::kF64:
      return reduce_typed(reinterpret_cast<double*>(dst), sources, n, op, size);
    case DType::kI32:
      return reduce_typed(reinterpret_cast<int32_t*>(dst), sources, n, op, size);
    case DType::kI64:
      return reduce_typed(reinterpret_cast<int64_t*>(dst), sources, n, op, size);
  }
}

}  // namespace

struct ShmCommunicator::Impl {
  explicit Impl(ShmCommunicatorOptions opts);
  ~Impl();

  // Rendezvous: map the segment and wait for every rank to attach.
  void attach();
  void map_segment();
  // Every other rank's shared region is read-only in this rank's mapping.
  // The zero-copy collectives only ever read a peer's region, so this is a
  // guard, and it is faster where mapping pages is dear: ZeRO 2 and 3 read
  // their peers' released and rewritten shards every step, each page mapped
  // again, and on a paravirtualised guest the host's side of a writable
  // entry costs more than a read-only one's (the guest takes the same
  // faults; docs/PERFORMANCE.md, "A peer's pages, read-only": such a
  // reduce-scatter 2.1-2.6x faster).
  void protect_peer_regions();
  // Queues `body` as one operation; it runs with `running` and the deadline set.
  std::shared_ptr<Work> enqueue(std::string what, int64_t bytes, std::function<void()> body);
  CommError describe_failure(const OpQueue::Op& op, std::exception_ptr error);

  Header& header() { return *reinterpret_cast<Header*>(base); }
  RankControl& control(int r) { return reinterpret_cast<RankControl*>(base + controls_offset)[r]; }
  std::byte* half(int r, int which) {
    return base + slots_offset + r * options.slot_bytes + which * half_bytes;
  }
  std::byte* shared_region(int r) { return base + shared_offset + r * options.shared_bytes; }
  // Whether [data, data + bytes) lies in this rank's shared region.
  bool in_shared_region(const std::byte* data, int64_t bytes) {
    const std::byte* region = shared_region(rank);
    return options.shared_bytes > 0 && data >= region &&
           data + bytes <= region + options.shared_bytes;
  }
  // Publishes where my operand starts in my region, waits for every rank to
  // do the same (so every operand is ready), and returns each rank's operand.
  std::vector<const std::byte*> exchange_operands(const std::byte* mine, const char* step);
  std::vector<int> ranks_behind(uint64_t target);
  // Arrive at the next phase and wait until every peer has too. `step` names
  // the point in the algorithm for errors.
  void sync(const char* step) { wait_for(arrive(), step); }
  // Sets the shape every later arrive publishes: each operation calls it
  // before its first synchronisation.
  void begin(const OpShape& shape) {
    shape_word = shape.word();
    shape_count = static_cast<uint64_t>(shape.count);
  }
  // Publishes the operation's shape and my next phase; returns the phase.
  uint64_t arrive();
  // Once every peer has reached `target`: throws a CommError for `op` unless
  // each published the same shape there as this rank.
  void check_shapes(uint64_t target, const OpQueue::Op& op, const char* step);
  [[noreturn]] void shapes_differ(uint64_t target, const OpQueue::Op& op, const char* step);
  // Whether every peer has reached `target`; peers before `next` are known to
  // have (counters only grow), so each look starts there.
  bool peers_reached(uint64_t target, int& next);
  // Waits until every peer reaches `target` and checks their shapes, failing
  // on the deadline, a dead peer or a different shape. Communication thread
  // only (it sets `running` and the deadline).
  void wait_for(uint64_t target, const char* step);
  // Spins, then yields between looks, up to budget_ns for every peer to reach
  // `target`; never fails (the deadline and liveness are wait_for's job).
  bool poll_for(uint64_t target, int64_t budget_ns);
  [[noreturn]] void fail(const std::string& reason, const char* step, std::vector<int> peers) {
    fail(*running, reason, step, std::move(peers));
  }
  [[noreturn]] void fail(const OpQueue::Op& op, const std::string& reason, const char* step,
                         std::vector<int> peers);

  void all_reduce(std::byte* data, int64_t count, DType dtype, ReduceOp op);
  // The small all-reduce, split where it waits so the caller's thread can
  // run the start and hand the finish to the communication thread.
  struct SmallAllReduce {
    std::byte* data;
    int64_t count;
    DType dtype;
    ReduceOp op;
    int parity;       // the slot half holding the operands
    uint64_t target;  // the phase every rank has reached once they are all there
  };
  bool is_small_all_reduce(int64_t bytes) const {
    return bytes <= std::min(kSmallAllReduceBytes, half_bytes);
  }
  SmallAllReduce small_all_reduce_start(std::byte* data, int64_t count, DType dtype, ReduceOp op);
  void small_all_reduce_finish(const SmallAllReduce& small);
  // Wraps a body so it runs with `running` and the deadline set.
  OpQueue::Body on_thread(std::function<void()> body);
  void reduce_scatter(const std::byte* input, std::byte* output, int64_t count, DType dtype,
                      ReduceOp op);
  void all_gather(const std::byte* input, std::byte* output, int64_t count, DType dtype);
  void broadcast(std::byte* data, int64_t count, DType dtype, int root);
  void all_reduce_in_place(std::byte* data, int64_t count, DType dtype, ReduceOp op);
  void reduce_scatter_in_place(const std::byte* input, std::byte* output, int64_t count,
                               DType dtype, ReduceOp op);
  void all_gather_in_place(const std::byte* input, std::byte* output, int64_t count, DType dtype);

  ShmCommunicatorOptions options;
  int rank;
  int size;
  int64_t half_bytes;
  int64_t controls_offset;
  int64_t slots_offset;
  int64_t shared_offset;
  int64_t mailbox_offset;
  int64_t total_bytes;
  int fd = -1;
  std::byte* base = nullptr;
  bool linked = false;  // rank 0 created the name and has not unlinked it yet

  std::unique_ptr<OpQueue> ops;
  // half(p, parity) of ranks 1..size-1: what the small all-reduce adds to
  // rank 0's operand (filled once mapped, so the fast path allocates nothing).
  std::vector<const std::byte*> peer_halves[2];
  std::unique_ptr<ShmMailboxes> mailboxes;  // null when options.mailbox_bytes is 0
  // The mailboxes, after checking the buffer and that point-to-point is on.
  ShmMailboxes& point_to_point(const void* data, int64_t count, const char* what);

  // Touched only by the communication thread once it runs.
  uint64_t phase = 0;
  uint64_t shape_word = 0, shape_count = 0;  // what arrive() publishes
  int parity = 0;                            // the slot half the next chunk uses
  const OpQueue::Op* running = nullptr;
  int64_t deadline_ns = 0;
};

ShmCommunicator::Impl::Impl(ShmCommunicatorOptions opts)
    : options(std::move(opts)), rank(options.rank), size(options.size) {
  const std::string& name = options.segment_name;
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 200) {
    throw_error("shm segment name '{}' must start with '/', contain no other '/' and be short",
                name);
  }
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error("shm group '{}': rank {} is not in a group of size {}", options.group_name, rank,
                size);
  }
  if (options.timeout_ms <= 0) {
    throw_error("shm group '{}': timeout_ms must be positive, got {}", options.group_name,
                options.timeout_ms);
  }
  if (options.slot_bytes % 256 != 0 || options.slot_bytes < 256 * size) {
    throw_error("shm group '{}': slot_bytes {} must be a multiple of 256 and at least {}",
                options.group_name, options.slot_bytes, 256 * size);
  }
  options.world_ranks =
      group_members("shm", options.group_name, size, std::move(options.world_ranks));
  if (options.shared_bytes < 0 || options.shared_bytes % kSlotAlignBytes != 0) {
    throw_error("shm group '{}': shared_bytes {} must be a non-negative multiple of {}",
                options.group_name, options.shared_bytes, kSlotAlignBytes);
  }
  half_bytes = options.slot_bytes / 2;
  controls_offset = round_up(sizeof(Header), kLineBytes);
  slots_offset = round_up(controls_offset + size * int64_t{sizeof(RankControl)}, kSlotAlignBytes);
  // Page-aligned, so that map_segment can protect each peer's region alone.
  shared_offset = round_up(slots_offset + size * options.slot_bytes, kSlotAlignBytes);
  mailbox_offset = shared_offset + size * options.shared_bytes;
  total_bytes =
      mailbox_offset +
      (options.mailbox_bytes > 0 ? ShmMailboxes::region_bytes(size, options.mailbox_bytes) : 0);
}

ShmCommunicator::Impl::~Impl() {
  // Both finish or fail what is queued while the segment is still mapped.
  mailboxes.reset();
  ops.reset();
  if (base != nullptr) ::munmap(base, total_bytes);
  if (fd >= 0) ::close(fd);
  if (linked) ::shm_unlink(options.segment_name.c_str());
}

void ShmCommunicator::Impl::map_segment() {
  void* address = ::mmap(nullptr, total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    throw_error("cannot map shm segment {} ({} bytes): {}", options.segment_name, total_bytes,
                std::strerror(errno));
  }
  base = static_cast<std::byte*>(address);
  protect_peer_regions();
}

void ShmCommunicator::Impl::protect_peer_regions() {
  if (options.shared_bytes == 0) return;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto [first, last] =
        whole_pages(shared_region(p), shared_region(p) + options.shared_bytes);
    // Only an optimisation and a guard: if the kernel refuses (too many
    // mappings), the region stays writable and every read still works.
    if (last > first) (void)::mprotect(reinterpret_cast<void*>(first), last - first, PROT_READ);
  }
}

void ShmCommunicator::Impl::attach() {
  const std::string& name = options.segment_name;
  const int64_t start_ns = now_ns();
  const int64_t rendezvous_deadline_ns = start_ns + options.timeout_ms * 1'000'000;
  if (rank == 0) {
    ::shm_unlink(name.c_str());  // a leftover of a killed job with the same name
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw_error("cannot create shm segment {}: {}", name, std::strerror(errno));
    linked = true;
    if (::ftruncate(fd, total_bytes) != 0) {
      throw_error("cannot size shm segment {} to {} bytes (is /dev/shm large enough?): {}", name,
                  total_bytes, std::strerror(errno));
    }
    map_segment();
    Header& h = header();
    h.world_size = static_cast<uint64_t>(size);
    h.slot_bytes = static_cast<uint64_t>(options.slot_bytes);
    h.creator_pid = static_cast<uint64_t>(::getpid());
    AtomicU64(h.magic).store(kMagic, std::memory_order_release);
  } else {
    // Retry until rank 0 has created, sized and initialised the segment.
    // One whose creator is gone is a leftover that rank 0 will replace.
    for (;;) {
      if (now_ns() > rendezvous_deadline_ns) {
        throw CommError(fmt::format("shm group '{}' (rank {} of {}): segment {} was not created "
                                    "by rank 0 within {} ms",
                                    options.group_name, rank, size, name, options.timeout_ms),
                        {0});
      }
      if (base != nullptr) {
        ::munmap(base, total_bytes);
        base = nullptr;
      }
      if (fd >= 0) {
        ::close(fd);
        fd = -1;
      }
      fd = ::shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0) {
        if (errno != ENOENT)
          throw_error("cannot open shm segment {}: {}", name, std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0 || st.st_size == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (st.st_size != total_bytes) {
        throw_error(
            "shm segment {} has {} bytes but rank {} expects {}: the ranks disagree on "
            "group size, slot_bytes, shared_bytes or mailbox_bytes",
            name, st.st_size, rank, total_bytes);
      }
      map_segment();
      Header& h = header();
      if (AtomicU64(h.magic).load(std::memory_order_acquire) != kMagic ||
          !process_exists(h.creator_pid)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (h.world_size != static_cast<uint64_t>(size) ||
          h.slot_bytes != static_cast<uint64_t>(options.slot_bytes)) {
        throw_error(
            "shm segment {} was made for {} ranks with {}-byte slots, rank {} expects {} "
            "ranks with {}-byte slots",
            name, h.world_size, h.slot_bytes, rank, size, options.slot_bytes);
      }
      break;
    }
  }
  AtomicU64(control(rank).pid).store(static_cast<uint64_t>(::getpid()), std::memory_order_release);
  AtomicU64(header().attached).fetch_add(1, std::memory_order_acq_rel);
  while (AtomicU64(header().attached).load(std::memory_order_acquire) <
         static_cast<uint64_t>(size)) {
    if (now_ns() > rendezvous_deadline_ns) {
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        if (AtomicU64(control(r).pid).load(std::memory_order_acquire) == 0) missing.push_back(r);
      }
      throw CommError(
          fmt::format("shm group '{}' (rank {} of {}): rank(s) {} did not attach to "
                      "segment {} within {} ms",
                      options.group_name, rank, size, rank_list(missing), name, options.timeout_ms),
          missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (linked) {
    // Everyone has it mapped: drop the name so a killed job leaves nothing behind.
    ::shm_unlink(name.c_str());
    linked = false;
  }
}

OpQueue::Body ShmCommunicator::Impl::on_thread(std::function<void()> body) {
  return [this, body = std::move(body)](const OpQueue::Op& op) {
    running = &op;
    deadline_ns = now_ns() + options.timeout_ms * 1'000'000;
    body();
  };
}

std::shared_ptr<Work> ShmCommunicator::Impl::enqueue(std::string what, int64_t bytes,
                                                     std::function<void()> body) {
  return ops->enqueue(std::move(what), bytes, on_thread(std::move(body)));
}

CommError ShmCommunicator::Impl::describe_failure(const OpQueue::Op& op, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    return e;  // sync() and fail() already name the step and the peers
  } catch (const std::exception& e) {
    return CommError(fmt::format("shm {} on group '{}' seq {} (rank {} of {}) failed: {}", op.what,
                                 options.group_name, op.seq, rank, size, e.what()),
                     {});
  }
}

std::vector<int> ShmCommunicator::Impl::ranks_behind(uint64_t target) {
  std::vector<int> behind;
  for (int r = 0; r < size; ++r) {
    if (r != rank && AtomicU64(control(r).phase).load(std::memory_order_acquire) < target) {
      behind.push_back(r);
    }
  }
  return behind;
}

void ShmCommunicator::Impl::fail(const OpQueue::Op& op, const std::string& reason, const char* step,
                                 std::vector<int> peers) {
  throw CommError(fmt::format("shm {} on group '{}' seq {} (rank {} of {}) failed at '{}': {}",
                              op.what, options.group_name, op.seq, rank, size, step, reason),
                  std::move(peers));
}

uint64_t ShmCommunicator::Impl::arrive() {
  const uint64_t target = ++phase;
  RankControl& mine = control(rank);
  // Relaxed: the release store of the phase publishes them.
  AtomicU64(mine.shape[target & 1][0]).store(shape_word, std::memory_order_relaxed);
  AtomicU64(mine.shape[target & 1][1]).store(shape_count, std::memory_order_relaxed);
  AtomicU64(mine.phase).store(target, std::memory_order_release);
  return target;
}

// Two loads per peer from the lines the wait has just read: free next to
// the synchronisation itself, which is why every wait checks rather than
// only an operation's first.
void ShmCommunicator::Impl::check_shapes(uint64_t target, const OpQueue::Op& op, const char* step) {
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    uint64_t(&theirs)[2] = control(p).shape[target & 1];
    if (AtomicU64(theirs[0]).load(std::memory_order_relaxed) != shape_word ||
        AtomicU64(theirs[1]).load(std::memory_order_relaxed) != shape_count) [[unlikely]] {
      shapes_differ(target, op, step);
    }
  }
}

void ShmCommunicator::Impl::shapes_differ(uint64_t target, const OpQueue::Op& op,
                                          const char* step) {
  std::string theirs;
  std::vector<int> peers;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    uint64_t(&shape)[2] = control(p).shape[target & 1];
    const uint64_t word = AtomicU64(shape[0]).load(std::memory_order_relaxed);
    const uint64_t count = AtomicU64(shape[1]).load(std::memory_order_relaxed);
    if (word == shape_word && count == shape_count) continue;
    peers.push_back(p);
    theirs += fmt::format("; rank {} runs {}", p, OpShape::from_words(word, count).describe());
  }
  fail(op,
       fmt::format("the ranks disagree on this operation: rank {} (this one) runs {}{}. Every "
                   "rank must issue the same collectives in the same order, with the same "
                   "count, dtype, reduction and root, and pass its operand in shared_buffer() "
                   "on every rank or on none",
                   rank, OpShape::from_words(shape_word, shape_count).describe(), theirs),
       step, std::move(peers));
}

bool ShmCommunicator::Impl::peers_reached(uint64_t target, int& next) {
  while (
      next < size &&
      (next == rank || AtomicU64(control(next).phase).load(std::memory_order_acquire) >= target)) {
    ++next;
  }
  return next == size;
}

bool ShmCommunicator::Impl::poll_for(uint64_t target, int64_t budget_ns) {
  int next = 0;
  const int64_t start_ns = now_ns();
  for (int spins = 1;; ++spins) {
    if (peers_reached(target, next)) return true;
    cpu_relax();
    if (spins % 64 != 0) continue;
    const int64_t waited_ns = now_ns() - start_ns;
    if (waited_ns > budget_ns) return false;
    if (waited_ns > kInlineSpinNs) ::sched_yield();
  }
}

void ShmCommunicator::Impl::wait_for(uint64_t target, const char* step) {
  int next = 0;
  int spins = 0;
  int64_t waiting_since_ns = 0;
  int64_t next_liveness_ns = 0;
  for (;;) {
    if (peers_reached(target, next)) {
      check_shapes(target, *running, step);
      return;
    }
    if (spins < kSpinIterations) {
      ++spins;
      cpu_relax();
      continue;
    }
    const int64_t now = now_ns();
    if (waiting_since_ns == 0) {
      waiting_since_ns = now;
      next_liveness_ns = now + kLivenessCheckNs;
    }
    if (now >= deadline_ns) {
      const std::vector<int> behind = ranks_behind(target);
      fail(fmt::format("timed out after {} ms: peer rank(s) {} had not arrived (stopped, hung, "
                       "or not calling this collective)",
                       options.timeout_ms, rank_list(behind)),
           step, behind);
    }
    if (now >= next_liveness_ns) {
      next_liveness_ns = now + kLivenessCheckNs;
      for (int r : ranks_behind(target)) {
        const uint64_t pid = AtomicU64(control(r).pid).load(std::memory_order_acquire);
        if (!process_exists(pid)) {
          fail(fmt::format("peer rank {} (pid {}) has exited", r, pid), step, {r});
        }
      }
    }
    if (now - waiting_since_ns < kYieldNs) {
      ::sched_yield();
    } else {
      std::this_thread::sleep_for(kNap);
    }
  }
}

void ShmCommunicator::Impl::all_reduce(std::byte* data, int64_t count, DType dtype, ReduceOp op) {
  begin({Collective::kAllReduce, Protocol::kStaged, dtype, op, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  const int64_t chunk = half_bytes / elem;
  std::vector<const std::byte*> sources(size - 1);
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int64_t n = std::min(chunk, count - offset);
    std::byte* mine = half(rank, parity);
    std::memcpy(mine, data + offset * elem, n * elem);
    sync("copy-in");
    const auto [begin, end] = share_of(n, rank, size, elem);
    if (end > begin) {
      int k = 0;
      for (int p = 0; p < size; ++p) {
        if (p != rank) sources[k++] = half(p, parity) + begin * elem;
      }
      reduce_into(mine + begin * elem, sources, end - begin, dtype, op, size);
    }
    sync("reduce");
    for (int p = 0; p < size; ++p) {
      const auto [b, e] = share_of(n, p, size, elem);
      std::memcpy(data + (offset + b) * elem, half(p, parity) + b * elem, (e - b) * elem);
    }
    parity ^= 1;
  }
}

// One synchronisation: every rank copies its operand into its slot half and
// arrives; once all have, each rank sums every slot in rank order into its
// buffer, so all ranks compute the same sums and agree bit for bit. Each rank
// reads the whole operand from every peer (size x the bytes of the two-step
// path), which is cheaper than a second synchronisation at these sizes. The
// half is safe to reuse two slot operations later: halves alternate, and a
// peer reaches the next operation's phase only after it finished reading.
ShmCommunicator::Impl::SmallAllReduce ShmCommunicator::Impl::small_all_reduce_start(std::byte* data,
                                                                                    int64_t count,
                                                                                    DType dtype,
                                                                                    ReduceOp op) {
  begin({Collective::kAllReduce, Protocol::kSmall, dtype, op, 0, count});
  SmallAllReduce small{data, count, dtype, op, parity, 0};
  // Count 0 still synchronises (every rank does), but its buffer may be null.
  if (count > 0) std::memcpy(half(rank, parity), data, count * dtype_bytes(dtype));
  parity ^= 1;
  small.target = arrive();
  return small;
}

void ShmCommunicator::Impl::small_all_reduce_finish(const SmallAllReduce& small) {
  if (small.count == 0) return;
  std::memcpy(small.data, half(0, small.parity), small.count * dtype_bytes(small.dtype));
  reduce_into(small.data, peer_halves[small.parity], small.count, small.dtype, small.op, size);
}

void ShmCommunicator::Impl::reduce_scatter(const std::byte* input, std::byte* output, int64_t count,
                                           DType dtype, ReduceOp op) {
  begin({Collective::kReduceScatter, Protocol::kStaged, dtype, op, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  const int64_t chunk = half_bytes / elem / size;  // of each rank's segment
  std::vector<const std::byte*> sources(size - 1);
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int64_t n = std::min(chunk, count - offset);
    std::byte* mine = half(rank, parity);
    // Peers need my piece of their segment; my own segment starts the sum.
    for (int s = 0; s < size; ++s) {
      const std::byte* piece = input + (s * count + offset) * elem;
      if (s != rank) std::memcpy(mine + s * n * elem, piece, n * elem);
    }
    std::byte* dst = output + offset * elem;
    const std::byte* own = input + (rank * count + offset) * elem;
    if (dst != own) std::memcpy(dst, own, n * elem);
    sync("copy-in");
    int k = 0;
    for (int p = 0; p < size; ++p) {
      if (p != rank) sources[k++] = half(p, parity) + rank * n * elem;
    }
    reduce_into(dst, sources, n, dtype, op, size);
    parity ^= 1;
  }
}

void ShmCommunicator::Impl::all_gather(const std::byte* input, std::byte* output, int64_t count,
                                       DType dtype) {
  begin({Collective::kAllGather, Protocol::kStaged, dtype, ReduceOp::kSum, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  populate_for_write(output, output + size * count * elem);
  const int64_t chunk = half_bytes / elem;
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int64_t n = std::min(chunk, count - offset);
    std::memcpy(half(rank, parity), input + offset * elem, n * elem);
    sync("copy-in");
    for (int p = 0; p < size; ++p) {
      const std::byte* source = p == rank ? input + offset * elem : half(p, parity);
      std::byte* target = output + (p * count + offset) * elem;
      if (target != source) std::memcpy(target, source, n * elem);
    }
    parity ^= 1;
  }
}

void ShmCommunicator::Impl::broadcast(std::byte* data, int64_t count, DType dtype, int root) {
  begin({Collective::kBroadcast, Protocol::kStaged, dtype, ReduceOp::kSum, root, count});
  const int64_t elem = dtype_bytes(dtype);
  const int64_t chunk = half_bytes / elem;
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int64_t n = std::min(chunk, count - offset);
    if (rank == root) std::memcpy(half(root, parity), data + offset * elem, n * elem);
    sync("root copy-in");
    if (rank != root) std::memcpy(data + offset * elem, half(root, parity), n * elem);
    parity ^= 1;
  }
}

std::vector<const std::byte*> ShmCommunicator::Impl::exchange_operands(const std::byte* mine,
                                                                       const char* step) {
  AtomicU64(control(rank).shared_offset)
      .store(static_cast<uint64_t>(mine - shared_region(rank)), std::memory_order_relaxed);
  sync(step);  // its release/acquire pairs publish the offsets with the data
  std::vector<const std::byte*> operands(size);
  for (int p = 0; p < size; ++p) {
    const uint64_t offset = AtomicU64(control(p).shared_offset).load(std::memory_order_relaxed);
    operands[p] = shared_region(p) + offset;
  }
  return operands;
}

// Zero-copy all-reduce: every rank's buffer is in the segment, so rank r
// sums share r of all buffers into its own buffer, then copies the other
// shares from their owners' buffers. Per rank that reads about 2x and writes
// 1x the buffer, against 3x and 3x through the staging slots.
void ShmCommunicator::Impl::all_reduce_in_place(std::byte* data, int64_t count, DType dtype,
                                                ReduceOp op) {
  begin({Collective::kAllReduce, Protocol::kInPlace, dtype, op, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  const std::vector<const std::byte*> operands = exchange_operands(data, "operands ready");
  const auto [begin, end] = share_of(count, rank, size, elem);
  if (end > begin) {
    std::vector<const std::byte*> sources;
    for (int p = 0; p < size; ++p) {
      if (p != rank) sources.push_back(operands[p] + begin * elem);
    }
    reduce_into(data + begin * elem, sources, end - begin, dtype, op, size);
  }
  sync("shares reduced");
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto [b, e] = share_of(count, p, size, elem);
    std::memcpy(data + b * elem, operands[p] + b * elem, (e - b) * elem);
  }
  sync("shares gathered");  // no rank may change its buffer while peers still read it
}

void ShmCommunicator::Impl::reduce_scatter_in_place(const std::byte* input, std::byte* output,
                                                    int64_t count, DType dtype, ReduceOp op) {
  begin({Collective::kReduceScatter, Protocol::kInPlace, dtype, op, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  const std::vector<const std::byte*> operands = exchange_operands(input, "operands ready");
  // In place when output is my own segment of input (ZeRO's layout).
  if (output != input + rank * count * elem) {
    std::memcpy(output, input + rank * count * elem, count * elem);
  }
  std::vector<const std::byte*> sources;
  for (int p = 0; p < size; ++p) {
    if (p != rank) sources.push_back(operands[p] + rank * count * elem);
  }
  reduce_into(output, sources, count, dtype, op, size);
  sync("segments reduced");
}

void ShmCommunicator::Impl::all_gather_in_place(const std::byte* input, std::byte* output,
                                                int64_t count, DType dtype) {
  begin({Collective::kAllGather, Protocol::kInPlace, dtype, ReduceOp::kSum, 0, count});
  const int64_t elem = dtype_bytes(dtype);
  // ZeRO 3 gathers into pages it released after their last use: take them
  // back at once, before the peers are waited for.
  populate_for_write(output, output + size * count * elem);
  const std::vector<const std::byte*> operands = exchange_operands(input, "operands ready");
  for (int p = 0; p < size; ++p) {
    if (output + p * count * elem != operands[p]) {
      std::memmove(output + p * count * elem, p == rank ? input : operands[p], count * elem);
    }
  }
  sync("gathered");
}

ShmCommunicator::ShmCommunicator(ShmCommunicatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->attach();
  Impl* impl = impl_.get();
  for (int which = 0; which < 2; ++which) {
    for (int p = 1; p < impl->size; ++p) impl->peer_halves[which].push_back(impl->half(p, which));
  }
  impl->ops = std::make_unique<OpQueue>(
      "shm", impl->options.group_name, impl->rank, impl->size,
      [impl](const OpQueue::Op& op, std::exception_ptr e) {
        return impl->describe_failure(op, std::move(e));
      },
      impl->options.world_ranks);
  impl->ops->start();
  if (impl->options.mailbox_bytes > 0) {
    impl->mailboxes = std::make_unique<ShmMailboxes>(
        impl->options.group_name, impl->ops->flight_group(), impl->rank, impl->size,
        impl->options.timeout_ms, impl->base + impl->mailbox_offset, impl->options.mailbox_bytes,
        [impl](int r) { return AtomicU64(impl->control(r).pid).load(std::memory_order_acquire); },
        impl->options.single_copy);
  }
}

ShmCommunicator::~ShmCommunicator() = default;

int ShmCommunicator::rank() const {
  return impl_->rank;
}
int ShmCommunicator::size() const {
  return impl_->size;
}
const std::string& ShmCommunicator::group_name() const {
  return impl_->options.group_name;
}
int64_t ShmCommunicator::timeout_ms() const {
  return impl_->options.timeout_ms;
}

std::shared_ptr<Work> ShmCommunicator::all_reduce(void* data, int64_t count, DType dtype,
                                                  ReduceOp op) {
  describe::check_operand("shm", data, count, "all_reduce");
  auto* buffer = static_cast<std::byte*>(data);
  const int64_t bytes = count * dtype_bytes(dtype);
  Impl* impl = impl_.get();
  std::string what = describe::all_reduce(count, dtype, op);
  if (!impl->is_small_all_reduce(bytes)) {
    return impl->enqueue(std::move(what), bytes, [impl, buffer, count, dtype, op, bytes] {
      if (impl->in_shared_region(buffer, bytes)) {
        impl->all_reduce_in_place(buffer, count, dtype, op);
      } else {
        impl->all_reduce(buffer, count, dtype, op);
      }
    });
  }
  // The rest of a small all-reduce once it has started: on the thread only.
  auto finish = [impl](const Impl::SmallAllReduce& small) {
    impl->wait_for(small.target, "copy-in");
    impl->small_all_reduce_finish(small);
  };
  auto work = impl->ops->try_inline(what, bytes, [&](const OpQueue::Op& inline_op) {
    // On the caller's thread `running` and the deadline belong to an older
    // operation: nothing here may wait_for() or fail() without naming its
    // own operation; poll_for() cannot fail.
    const Impl::SmallAllReduce small = impl->small_all_reduce_start(buffer, count, dtype, op);
    if (impl->poll_for(small.target, kInlinePollNs)) {
      impl->check_shapes(small.target, inline_op, "copy-in");  // try_inline fails it on the thread
      impl->small_all_reduce_finish(small);
      return OpQueue::Body();
    }
    return impl->on_thread([finish, small] { finish(small); });
  });
  if (work) return work;
  return impl->enqueue(std::move(what), bytes, [impl, finish, buffer, count, dtype, op] {
    finish(impl->small_all_reduce_start(buffer, count, dtype, op));
  });
}

std::shared_ptr<Work> ShmCommunicator::reduce_scatter(const void* input, void* output,
                                                      int64_t count, DType dtype, ReduceOp op) {
  describe::check_operand("shm", input, count, "reduce_scatter");
  describe::check_operand("shm", output, count, "reduce_scatter");
  auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return impl_->enqueue(describe::reduce_scatter(count, dtype, op),
                        count * impl_->size * dtype_bytes(dtype),
                        [impl = impl_.get(), in, out, count, dtype, op] {
                          if (impl->in_shared_region(in, count * impl->size * dtype_bytes(dtype))) {
                            impl->reduce_scatter_in_place(in, out, count, dtype, op);
                          } else {
                            impl->reduce_scatter(in, out, count, dtype, op);
                          }
                        });
}

std::shared_ptr<Work> ShmCommunicator::all_gather(const void* input, void* output, int64_t count,
                                                  DType dtype) {
  describe::check_operand("shm", input, count, "all_gather");
  describe::check_operand("shm", output, count, "all_gather");
  auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return impl_->enqueue(describe::all_gather(count, dtype), count * dtype_bytes(dtype),
                        [impl = impl_.get(), in, out, count, dtype] {
                          if (impl->in_shared_region(in, count * dtype_bytes(dtype))) {
                            impl->all_gather_in_place(in, out, count, dtype);
                          } else {
                            impl->all_gather(in, out, count, dtype);
                          }
                        });
}

std::shared_ptr<Work> ShmCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  describe::check_operand("shm", data, count, "broadcast");
  if (root < 0 || root >= impl_->size) {
    throw_error("shm broadcast on group '{}': root {} is not in a group of size {}",
                impl_->options.group_name, root, impl_->size);
  }
  auto* bytes = static_cast<std::byte*>(data);
  return impl_->enqueue(describe::broadcast(count, dtype, root), count * dtype_bytes(dtype),
                        [impl = impl_.get(), bytes, count, dtype, root] {
                          impl->broadcast(bytes, count, dtype, root);
                        });
}

void* ShmCommunicator::shared_buffer() {
  return impl_->options.shared_bytes > 0 ? impl_->shared_region(impl_->rank) : nullptr;
}

int64_t ShmCommunicator::single_copy_messages() const {
  return impl_->mailboxes ? impl_->mailboxes->single_copy_messages() : 0;
}

int64_t ShmCommunicator::single_copy_reads() const {
  return impl_->mailboxes ? impl_->mailboxes->single_copy_reads() : 0;
}

int64_t ShmCommunicator::shared_buffer_bytes() const {
  return impl_->options.shared_bytes;
}

ShmMailboxes& ShmCommunicator::Impl::point_to_point(const void* data, int64_t count,
                                                    const char* what) {
  describe::check_operand("shm", data, count, what);
  if (!mailboxes) {
    throw_error("shm {} on group '{}': point-to-point is off (mailbox_bytes is 0)", what,
                options.group_name);
  }
  return *mailboxes;
}

std::shared_ptr<Work> ShmCommunicator::send(const void* data, int64_t count, DType dtype, int peer,
                                            uint32_t tag) {
  return impl_->point_to_point(data, count, "send")
      .send(static_cast<const std::byte*>(data), count * dtype_bytes(dtype), peer, tag,
            describe::send(count, dtype, peer, tag));
}

std::shared_ptr<Work> ShmCommunicator::recv(void* data, int64_t count, DType dtype, int peer,
                                            uint32_t tag) {
  return impl_->point_to_point(data, count, "recv")
      .recv(static_cast<std::byte*>(data), count * dtype_bytes(dtype), peer, tag,
            describe::recv(count, dtype, peer, tag));
}

std::shared_ptr<Work> ShmCommunicator::barrier() {
  return impl_->enqueue("barrier", 0, [impl = impl_.get()] {
    impl->begin({});  // a barrier's shape is the default
    impl->sync("barrier");
  });
}

}  // namespace brigade

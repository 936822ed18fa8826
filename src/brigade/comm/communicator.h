// The communicator: what every collective backend (shm, gloo, later nccl)
// offers the layers above it. A Communicator is one process group: `size()`
// ranks that call the same collectives, with the same counts and dtypes, in
// the same order. Nothing above comm/ knows which backend it talks to.
//
// Every operation is asynchronous: it is queued on the backend's
// communication thread and returns a Work handle at once, so the caller can
// go on computing (the data-parallel layer overlaps gradient buckets with
// backward this way). A backend may start a small operation on the caller's
// thread when nothing else is queued (shm does, for all-reduces up to 64 KiB,
// to save the thread hand-off), but only for a bounded poll: no call waits
// for peers beyond about a millisecond, so issuing an operation never
// deadlocks against a peer that first waits for something else. Operations
// of one communicator run in the order they were issued. The caller's
// buffers must stay alive and untouched until the Work is done.
//
// Every operation is bounded by the communicator's timeout_ms (counted from
// when the operation starts running). A peer that is stopped, hung or dead
// turns into a CommError naming the operation, the group, the operation's
// sequence number and the peer ranks that had not arrived; never a hang.
// After an error the group's ranks no longer agree on where they are, so a
// backend fails every later operation too; recovery means a new group.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"

namespace brigade {

enum class DType { kF32, kF64, kI32, kI64 };

inline int64_t dtype_bytes(DType dtype) {
  return (dtype == DType::kF32 || dtype == DType::kI32) ? 4 : 8;
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "?";
}

// kAvg is the sum divided by the group size; for integer dtypes that division
// truncates toward zero, like C++'s.
enum class ReduceOp { kSum, kAvg, kMax };

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

// A failed collective: a timeout, a peer that exited, a broken group.
// peer_ranks() are the group ranks blamed (those that had not arrived), so
// the elastic layer can report a root cause without parsing the message.
class CommError : public Error {
 public:
  CommError(const std::string& message, std::vector<int> peer_ranks)
      : Error(message), peer_ranks_(std::move(peer_ranks)) {}
  const std::vector<int>& peer_ranks() const { return peer_ranks_; }

 private:
  std::vector<int> peer_ranks_;
};

// The handle of one queued operation. Shared between the caller and the
// backend's communication thread, which calls finish() exactly once.
class Work {
 public:
  // Blocks until the operation is done; rethrows its error (every call).
  // The operation's own timeout bounds the wait.
  void wait() {
    const bool slept = poll_ && !poll_until_done();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return done_; });
    }
    if (slept && asleep_) asleep_(false);
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }

  // For a backend whose waiter can move its own operation along (shm
  // send/recv: the copy into or out of the ring): wait() first calls `poll`
  // over and over for up to poll_ns, and only then sleeps until finish().
  // A message that is already on its way then costs no thread hand-off (a
  // sleeping waiter is woken tens of microseconds late on a busy machine),
  // while a recv that waits for a peer still computing gives its core back
  // soon. `asleep`, if set, is called with true when the waiter stops
  // polling and goes to sleep, and with false once it has woken, so the
  // backend knows when someone is blocked on it. `poll` must never block;
  // set before the Work is handed out.
  void set_poll(std::function<void()> poll, int64_t poll_ns,
                std::function<void(bool)> asleep = {}) {
    poll_ = std::move(poll);
    poll_ns_ = poll_ns;
    asleep_ = std::move(asleep);
  }

  // Whether the operation is done (succeeded or failed); never blocks or throws.
  bool test() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  // When the operation finished (steady clock, now_ns()); 0 while running.
  int64_t finished_ns() {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_ns_;
  }

  // For backends: marks the operation done, failed if `error` is set.
  void finish(std::exception_ptr error = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      finished_ns_ = now_ns();
      error_ = std::move(error);
    }
    finished_.store(true, std::memory_order_release);
    done_cv_.notify_all();
  }

 private:
  // True when the work finished while polling; false when the waiter gave up.
  bool poll_until_done() {
    const int64_t until = now_ns() + poll_ns_;
    // No yield in between: on a loaded machine a yielding waiter loses its
    // core for a whole time slice, far longer than the transfer it waits for.
    for (int i = 0; !finished_.load(std::memory_order_acquire); ++i) {
      poll_();
      if ((i & 63) == 63 && now_ns() > until) {
        if (asleep_) asleep_(true);
        return false;
      }
    }
    return true;
  }

  std::function<void()> poll_;
  std::function<void(bool)> asleep_;
  int64_t poll_ns_ = 0;
  std::atomic<bool> finished_{false};  // done_, readable without the mutex
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  int64_t finished_ns_ = 0;
  std::exception_ptr error_;
};

// Counts are in elements of `dtype`. Buffers may alias only where a call says
// so (all_reduce and broadcast work in place).
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's rank within the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name in errors and traces ("world", "dp0", "tp3").
  virtual const std::string& group_name() const = 0;
  virtual int64_t timeout_ms() const = 0;

  // data[0, count) <- op over every rank's data[0, count). Any count; every
  // rank ends with bit-identical results.
  virtual std::shared_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;

  // input holds count * size() elements: segment s is input[s*count, (s+1)*count).
  // output[0, count) <- op over every rank's segment rank(). Every rank passes
  // the same count (pad the last rank's share if the total does not divide).
  // output may be this rank's own segment of input (ZeRO reduces in place).
  virtual std::shared_ptr<Work> reduce_scatter(const void* input, void* output, int64_t count,
                                               DType dtype, ReduceOp op) = 0;

  // output[s*count, (s+1)*count) <- rank s's input[0, count), for every s.
  // Every rank passes the same count. input may be this rank's own segment
  // of output (ZeRO gathers parameters in place).
  virtual std::shared_ptr<Work> all_gather(const void* input, void* output, int64_t count,
                                           DType dtype) = 0;

  // data[0, count) <- root's data[0, count) on every rank.
  virtual std::shared_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root) = 0;

  // Done once every rank has called barrier() (and finished what it queued before).
  virtual std::shared_ptr<Work> barrier() = 0;

  // Point-to-point, for pipeline stages. A recv takes the oldest message
  // from `peer` with `tag` (MPI's matching rule); the counts must agree.
  // Sends and recvs are eager and independent of the collectives: a send is
  // done once its data has left the caller's buffer and never waits for the
  // recv to be posted, so two ranks may both send first without deadlock.
  // The timeout counts from the call.
  virtual std::shared_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer,
                                     uint32_t tag) = 0;
  virtual std::shared_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer,
                                     uint32_t tag) = 0;

  // This rank's peer-visible memory, shared_buffer_bytes() long, where the
  // backend runs collectives without copying (the shm backend's shared
  // region), or null. Training places its flat buffers there when it fits.
  virtual void* shared_buffer() { return nullptr; }
  virtual int64_t shared_buffer_bytes() const { return 0; }
};

}  // namespace brigade

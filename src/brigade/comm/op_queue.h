// The operation queue behind every thread-based backend (shm, gloo).
//
// Callers enqueue operations and get a Work at once; one communication
// thread runs them in issue order, so the caller computes while the collective
// runs. Each operation is recorded in the flight recorder (scheduled,
// started, completed or failed). When one fails, the ranks no longer agree on
// where they are in the sequence, so the queue fails every later operation at
// once with the original cause; recovery means a new communicator.
//
// Small operations can skip the hand-off (two thread wake-ups, tens of
// microseconds on a busy machine, against a collective of about one): when
// nothing is queued or running, try_inline() starts the operation on the
// caller's thread and polls for a bounded time; whatever is left when the
// bound runs out goes to the thread like any other operation. So a call still
// returns within microseconds and never waits on the caller's thread for
// peers that may be waiting for it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/comm/flight_recorder.h"

namespace brigade {

class OpQueue {
 public:
  struct Op {
    uint64_t seq = 0;  // the operation's sequence number within its group
    std::string what;  // "all_reduce(count 1024, f32, sum)"
  };
  // Runs one operation on the communication thread; throws on failure.
  using Body = std::function<void(const Op&)>;
  // Turns whatever a failed operation threw into the CommError its caller
  // sees; the backend adds its diagnosis (which peers went silent).
  using OnFailure = std::function<CommError(const Op&, std::exception_ptr)>;

  // `backend` ("shm", "gloo") and the group identify operations in messages.
  // The queue registers the group with the flight recorder: world_ranks is
  // the world rank of each group rank, or empty when they are the same
  // (group_members() checks it).
  OpQueue(std::string backend, std::string group_name, int rank, int size, OnFailure on_failure,
          std::vector<int> world_ranks = {});
  // Runs what is queued (each operation bounded by its backend's timeout),
  // then stops the thread.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Starts the communication thread: after the backend has connected.
  void start();
  // `bytes` is this rank's operand size, for the flight recorder.
  std::shared_ptr<Work> enqueue(std::string what, int64_t bytes, Body body);

  // The group's id in the flight recorder, for the backend's point-to-point
  // records (which it numbers itself, as RecordKind::kPointToPoint).
  FlightRecorder::GroupId flight_group() const { return flight_group_; }

  // If nothing is queued or running (and the group has not failed), runs
  // `attempt(op)` on the caller's thread at once, in the operation's place in
  // the sequence. The attempt starts the operation and may poll for a bounded
  // time; it returns an empty Body if it finished, or the Body that finishes
  // it, which the thread runs before anything issued later. Returns null
  // without calling `attempt` when the queue is busy: then enqueue() the whole
  // operation as usual.
  template <typename Attempt>
  std::shared_ptr<Work> try_inline(const std::string& what, int64_t bytes, Attempt&& attempt) {
    std::optional<Queued> inline_op = begin_inline(what, bytes);
    if (!inline_op) return nullptr;
    try {
      inline_op->body = attempt(inline_op->op);
    } catch (...) {
      // Fail it on the thread, where failures are diagnosed and recorded.
      inline_op->body = [error = std::current_exception()](const Op&) {
        std::rethrow_exception(error);
      };
    }
    return end_inline(std::move(*inline_op));
  }

 private:
  struct Queued {
    Op op;
    uint64_t record_id;
    Body body;
    std::shared_ptr<Work> work;
    bool started = false;  // began on the caller's thread
  };
  void run_loop();
  // Runs one operation; returns its error (null on success) for the Work.
  std::exception_ptr run(Queued& queued);
  std::optional<Queued> begin_inline(const std::string& what, int64_t bytes);
  std::shared_ptr<Work> end_inline(Queued inline_op);

  const std::string backend_;
  const std::string group_name_;
  const int rank_;
  const int size_;
  const OnFailure on_failure_;
  const FlightRecorder::GroupId flight_group_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Queued> queue_;
  uint64_t next_seq_ = 0;
  bool stopping_ = false;
  bool running_ = false;        // the thread is running an operation
  bool inline_active_ = false;  // a caller is running one (try_inline)
  std::thread thread_;

  // Written only by the communication thread while running_; read by
  // begin_inline under the mutex when it is not.
  std::string broken_;  // why the group failed; empty while healthy
  std::vector<int> broken_peers_;
};

}  // namespace brigade

// The operation queue behind every thread-based backend (shm, gloo).
//
// Callers enqueue operations and get a Work at once; one communication
// thread runs them in issue order, so the caller computes while the collective
// runs. Each operation is recorded in the flight recorder (scheduled,
// started, completed or failed). When one fails, the ranks no longer agree on
// where they are in the sequence, so the queue fails every later operation at
// once with the original cause; recovery means a new communicator.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/communicator.h"

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
  OpQueue(std::string backend, std::string group_name, int rank, int size, OnFailure on_failure);
  // Runs what is queued (each operation bounded by its backend's timeout),
  // then stops the thread.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Starts the communication thread: after the backend has connected.
  void start();
  // `bytes` is this rank's operand size, for the flight recorder.
  std::shared_ptr<Work> enqueue(std::string what, int64_t bytes, Body body);

 private:
  struct Queued {
    Op op;
    uint64_t record_id;
    Body body;
    std::shared_ptr<Work> work;
  };
  void run_loop();
  void run(Queued& queued);

  const std::string backend_;
  const std::string group_name_;
  const int rank_;
  const int size_;
  const OnFailure on_failure_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Queued> queue_;
  uint64_t next_seq_ = 0;
  bool stopping_ = false;
  std::thread thread_;

  // Touched only by the communication thread.
  std::string broken_;  // why the group failed; empty while healthy
  std::vector<int> broken_peers_;
};

}  // namespace brigade

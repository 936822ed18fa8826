#include "brigade/comm/op_queue.h"

#include <fmt/format.h>

#include "brigade/comm/flight_recorder.h"

namespace brigade {

OpQueue::OpQueue(std::string backend, std::string group_name, int rank, int size,
                 OnFailure on_failure)
    : backend_(std::move(backend)),
      group_name_(std::move(group_name)),
      rank_(rank),
      size_(size),
      on_failure_(std::move(on_failure)) {}

OpQueue::~OpQueue() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
}

void OpQueue::start() {
  thread_ = std::thread([this] { run_loop(); });
}

std::shared_ptr<Work> OpQueue::enqueue(std::string what, int64_t bytes, Body body) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t seq = next_seq_++;
    const uint64_t record_id =
        FlightRecorder::global().scheduled(group_name_, seq, backend_, what, bytes);
    queue_.push_back(Queued{Op{seq, std::move(what)}, record_id, std::move(body), work});
  }
  queue_cv_.notify_one();
  return work;
}

std::optional<OpQueue::Queued> OpQueue::begin_inline(const std::string& what, int64_t bytes) {
  Queued queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (running_ || inline_active_ || !queue_.empty() || !broken_.empty()) return std::nullopt;
    inline_active_ = true;
    queued.op.seq = next_seq_++;
    queued.record_id = FlightRecorder::global().scheduled(group_name_, queued.op.seq, backend_,
                                                          what, bytes, /*started=*/true);
  }
  queued.op.what = what;
  queued.started = true;
  return queued;
}

std::shared_ptr<Work> OpQueue::end_inline(Queued inline_op) {
  auto work = std::make_shared<Work>();
  const bool finished = !inline_op.body;
  if (finished) {
    FlightRecorder::global().completed(inline_op.record_id);
    work->finish();
  } else {
    inline_op.work = work;
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finished) queue_.push_front(std::move(inline_op));
    inline_active_ = false;
    wake = !queue_.empty();
  }
  if (wake) queue_cv_.notify_one();
  return work;
}

void OpQueue::run_loop() {
  for (;;) {
    Queued queued;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // An operation a caller is running inline comes before anything queued.
      queue_cv_.wait(lock, [&] { return !inline_active_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;
      queued = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run(queued);
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }
}

void OpQueue::run(Queued& queued) {
  FlightRecorder& recorder = FlightRecorder::global();
  const Op& op = queued.op;
  if (!broken_.empty()) {
    recorder.failed(queued.record_id, "not run: the group failed earlier");
    queued.work->finish(std::make_exception_ptr(
        CommError(fmt::format("{} {} on group '{}' seq {} (rank {} of {}) not run: the group "
                              "failed earlier: {}",
                              backend_, op.what, group_name_, op.seq, rank_, size_, broken_),
                  broken_peers_)));
    return;
  }
  if (!queued.started) recorder.started(queued.record_id);
  try {
    queued.body(op);
  } catch (...) {
    CommError error = on_failure_(op, std::current_exception());
    recorder.failed(queued.record_id, error.what());
    try {
      recorder.dump_to_run_dir(rank_);
    } catch (const std::exception&) {
      // The communication error is what the caller must see; a dump that
      // cannot be written (disk full) must not replace it.
    }
    broken_ = error.what();
    broken_peers_ = error.peer_ranks();
    queued.work->finish(std::make_exception_ptr(std::move(error)));
    return;
  }
  recorder.completed(queued.record_id);
  queued.work->finish();
}

}  // namespace brigade

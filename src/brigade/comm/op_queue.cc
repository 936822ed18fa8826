#include "brigade/comm/op_queue.h"

#include <fmt/format.h>

#include "brigade/comm/flight_recorder.h"

namespace brigade {

OpQueue::OpQueue(std::string backend, std::string group_name, int rank, int size,
                 OnFailure on_failure, std::vector<int> world_ranks)
    : backend_(std::move(backend)),
      group_name_(std::move(group_name)),
      rank_(rank),
      size_(size),
      on_failure_(std::move(on_failure)),
      flight_group_(FlightRecorder::global().add_group(
          {group_name_, rank_, size_,
           group_members(backend_, group_name_, size_, std::move(world_ranks))})) {}

OpQueue::~OpQueue() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    thread_.join();
  }
  FlightRecorder::global().close_group(flight_group_);
}

void OpQueue::start() {
  thread_ = std::thread([this] { run_loop(); });
}

std::shared_ptr<Work> OpQueue::enqueue(std::string what, int64_t bytes, Body body) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t seq = next_seq_++;
    const uint64_t record_id = FlightRecorder::global().scheduled(
        flight_group_, RecordKind::kCollective, seq, backend_, what, bytes);
    queue_.push_back(Queued{Op{seq, std::move(what)}, record_id, std::move(body), work});
  }
  queue_cv_.notify_one();
  return work;
}

std::optional<OpQueue::Queued> OpQueue::begin_inline(const std::string& what, int64_t bytes) {
  Queued queued;
  queued.op.what = what;
  queued.started = true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_ || inline_active_ || !queue_.empty() || !broken_.empty()) return std::nullopt;
  queued.record_id = FlightRecorder::global().scheduled(
      flight_group_, RecordKind::kCollective, next_seq_, backend_, what, bytes, /*started=*/true);
  // Nothing above changed the queue's state, so a throw there leaves it as it was.
  queued.op.seq = next_seq_++;
  inline_active_ = true;
  return queued;
}

std::shared_ptr<Work> OpQueue::end_inline(Queued inline_op) {
  const bool finished = !inline_op.body;
  const uint64_t record_id = inline_op.record_id;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The thread waits on inline_active_: clear it on every way out (an
    // allocation below can throw), and wake the thread if it has work or is
    // being stopped. Not otherwise: a needless wake-up costs the other core.
    struct Release {
      OpQueue& queue;
      ~Release() {
        queue.inline_active_ = false;
        if (queue.stopping_ || !queue.queue_.empty()) queue.queue_cv_.notify_one();
      }
    } release{*this};
    work = std::make_shared<Work>();
    if (!finished) {
      inline_op.work = work;
      queue_.push_front(std::move(inline_op));
    }
  }
  if (finished) {
    FlightRecorder::global().completed(record_id);
    work->finish();
  }
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
    std::exception_ptr error = run(queued);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    // Only now: a caller woken by this may issue its next operation at once,
    // and should find the queue idle (so a small one can run inline).
    queued.work->finish(std::move(error));
  }
}

std::exception_ptr OpQueue::run(Queued& queued) {
  FlightRecorder& recorder = FlightRecorder::global();
  const Op& op = queued.op;
  if (!broken_.empty()) {
    recorder.failed(queued.record_id, "not run: the group failed earlier");
    return std::make_exception_ptr(
        CommError(fmt::format("{} {} on group '{}' seq {} (rank {} of {}) not run: the group "
                              "failed earlier: {}",
                              backend_, op.what, group_name_, op.seq, rank_, size_, broken_),
                  broken_peers_));
  }
  if (!queued.started) recorder.started(queued.record_id);
  try {
    queued.body(op);
  } catch (...) {
    CommError error = on_failure_(op, std::current_exception());
    recorder.failed(queued.record_id, error.what());
    try {
      recorder.dump_to_run_dir();
    } catch (const std::exception&) {
      // The communication error is what the caller must see; a dump that
      // cannot be written (disk full) must not replace it.
    }
    broken_ = error.what();
    broken_peers_ = error.peer_ranks();
    return std::make_exception_ptr(std::move(error));
  }
  recorder.completed(queued.record_id);
  return nullptr;
}

}  // namespace brigade

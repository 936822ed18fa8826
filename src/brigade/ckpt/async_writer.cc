#include "brigade/ckpt/async_writer.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/trace.h"

namespace brigade {
namespace fs = std::filesystem;

AsyncCheckpointWriter::AsyncCheckpointWriter(int64_t commit_timeout_ms)
    : commit_timeout_ms_(commit_timeout_ms) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  // Reached with a save in flight only on a way out (an error, a broken
  // group): rank 0 must not wait out the commit timeout for shards that
  // will never come.
  abort_.store(true, std::memory_order_release);
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade: the last checkpoint save failed: %s\n", e.what());
  }
}

void AsyncCheckpointWriter::set_state(State state) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.store(state, std::memory_order_release);
  }
  state_changed_.notify_all();
}

void AsyncCheckpointWriter::wait_until_written() {
  std::unique_lock<std::mutex> lock(mutex_);
  state_changed_.wait(lock, [&] { return state_.load() != State::kWriting; });
}

std::string AsyncCheckpointWriter::error_message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) return {};
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

void AsyncCheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

std::vector<float*> AsyncCheckpointWriter::claim(const Save& save,
                                                 const std::vector<CheckpointPiece>& pieces) {
  BRIGADE_CHECK(save.writing.recycle && state() != State::kWriting);
  // A failed save stops the snapshots at the next poll: nothing to claim for.
  if (state() == State::kFailed) return {};
  spare_mappings_.reserve(static_cast<size_t>(save.keep) + 2);
  try {
    return claim_checkpoint_shard(save.root, save.step, save.rank,
                                  ParamLayout(save.config, save.tp_rank, save.tp_size, save.layers),
                                  pieces, spare_mappings_);
  } catch (const std::exception&) {
    return {};  // the save itself meets the cause and reports it
  }
}

void AsyncCheckpointWriter::abort() {
  abort_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  error_ = nullptr;
  stats_taken_ = true;
  set_state(State::kIdle);
}

std::optional<AsyncCheckpointWriter::Stats> AsyncCheckpointWriter::take_finished() {
  const State state = state_.load(std::memory_order_acquire);
  if (thread_.joinable() && state != State::kDone && state != State::kFailed) return std::nullopt;
  wait();
  set_state(State::kIdle);
  if (stats_taken_) return std::nullopt;
  stats_taken_ = true;
  return stats_;
}

void AsyncCheckpointWriter::start(Save save, const std::vector<CheckpointPiece>& pieces) {
  wait();
  const int64_t copy_start = now_ns();
  int64_t total = 0;
  for (const CheckpointPiece& p : pieces) total += p.end - p.begin;
  if (!save.staged) {
    pieces_ = pieces;
  } else {
    if (total > staging_floats_) {
      const size_t align = AtomicFileWriter::kDirectAlign;
      const size_t bytes = (static_cast<size_t>(total) * sizeof(float) + align - 1) / align * align;
      staging_.reset(static_cast<float*>(std::aligned_alloc(align, bytes)));
      if (!staging_) throw_error("cannot allocate {} bytes to stage a checkpoint", bytes);
      staging_floats_ = total;
    }
    pieces_.clear();
    float* next = staging_.get();
    for (const CheckpointPiece& p : pieces) {
      const int64_t n = p.end - p.begin;
      if (n > 0) std::memcpy(next, p.data, static_cast<size_t>(n) * sizeof(float));
      pieces_.push_back({p.kind, p.begin, p.end, next});
      next += n;
    }
  }
  stats_ = Stats{save.step, 0, static_cast<double>(now_ns() - copy_start) * 1e-6, 0};
  stats_.prewritten = save.writing.prewritten;
  stats_taken_ = false;
  abort_.store(false, std::memory_order_release);
  set_state(State::kWriting);
  thread_ = std::thread([this, save = std::move(save)] {
    // Snapshots recycle their files (ShardWriting); checkpoints do not.
    const trace::Scope span("ckpt", save.writing.recycle ? "write snapshot" : "write checkpoint",
                            save.step);
    const int64_t write_start = now_ns();
    const int64_t cpu_start = thread_cpu_ns();
    State outcome = State::kDone;
    try {
      run(save);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      outcome = State::kFailed;
    }
    stats_.write_ms = static_cast<double>(now_ns() - write_start) * 1e-6;
    stats_.write_cpu_ms = static_cast<double>(thread_cpu_ns() - cpu_start) * 1e-6;
    set_state(outcome);
  });
}

void AsyncCheckpointWriter::run(const Save& save) {
  // Phase 1, on every rank: a directory that cannot be made fails this
  // rank's part like a shard that cannot be written.
  create_checkpoint_directory(save.root, save.step);
  ShardWriting writing = save.writing;
  spare_mappings_.sweep();
  if (writing.recycle) {
    // The kept saves and the one being written (keep 0: no pruning, no spares).
    spare_mappings_.reserve(static_cast<size_t>(save.keep) + 2);
    writing.mappings = &spare_mappings_;
  }
  stats_.bytes = write_checkpoint_shard(
      save.root, save.step, save.rank,
      ParamLayout(save.config, save.tp_rank, save.tp_size, save.layers), pieces_, writing);
  if (save.written) save.written();
  if (!save.commits()) return;
  set_state(State::kWaiting);
  const int64_t deadline = now_ns() + commit_timeout_ms_ * 1'000'000;
  const int first = save.part ? save.part->first_rank : 0;
  const int count = save.part ? save.part->ranks : save.num_shards;
  for (;;) {
    int missing = -1;
    for (int r = first; r < first + count && missing < 0; ++r) {
      fs::path index = partial_shard_path(save.root, save.step, r);
      if (!fs::exists(index.replace_extension(".json"))) missing = r;
    }
    if (missing < 0) break;
    if (abort_.load(std::memory_order_acquire)) {
      throw_error("checkpoint of step {}: given up while waiting for rank {}'s shard", save.step,
                  missing);
    }
    if (now_ns() > deadline) {
      throw_error(
          "checkpoint of step {}: rank {}'s shard did not appear within {} ms (is the checkpoint "
          "directory on a file system every rank shares?)",
          save.step, missing, commit_timeout_ms_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (save.part) {
    NodePart part = *save.part;
    part.step = save.step;
    part.num_shards = save.num_shards;
    part.config = save.config;
    if (save.rank == 0) part.header = save.header;
    commit_node_part(save.root, part, save.keep, save.writing.recycle);
    return;
  }
  commit_checkpoint(save.root, save.step, save.num_shards, save.config, save.header);
  // The step is committed: a prune that fails leaves an old step too many,
  // not a failed save.
  try {
    prune_checkpoints(save.root, save.keep, save.writing.recycle);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade: could not prune old checkpoints: %s\n", e.what());
  }
}

}  // namespace brigade

// The flight recorder: every rank remembers its last few thousand
// collectives, so that when a job hangs or a peer dies, each rank can say
// which operation it was in, how far it got, and since when. Comparing the
// ranks' dumps (same group, different last sequence numbers, or one rank
// still "started" where the others completed) is how a hang is traced to the
// rank that caused it; diag/ will do that comparison.
//
// One recorder per process, shared by all of its communicators. Recording is
// a mutex and a few stores per operation: nothing next to the cost of a
// collective.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace brigade {

enum class OpState { kScheduled, kStarted, kCompleted, kFailed };

struct FlightRecord {
  uint64_t id = 0;    // process-wide, increasing
  std::string group;  // the communicator's group name
  uint64_t seq = 0;   // the operation's sequence number within its group
  std::string op;     // "all_reduce(count 1024, f32, sum)"
  int64_t bytes = 0;  // this rank's operand size
  OpState state = OpState::kScheduled;
  int64_t scheduled_ns = 0, started_ns = 0, finished_ns = 0;  // steady clock
  std::string error;                                          // for kFailed
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 4096);

  // The process's recorder.
  static FlightRecorder& global();

  // Records a queued operation; returns its id for the updates below.
  uint64_t scheduled(std::string_view group, uint64_t seq, std::string_view op, int64_t bytes) {
    return scheduled(group, seq, {}, op, bytes);
  }
  // The same, with the backend named before the operation ("shm
  // all_reduce(...)"), and marked started at once if `started` (an operation
  // the caller runs inline). Reuses the ring slot's strings, so recording
  // allocates nothing once the ring has wrapped.
  uint64_t scheduled(std::string_view group, uint64_t seq, std::string_view backend,
                     std::string_view op, int64_t bytes, bool started = false);
  void started(uint64_t id);
  void completed(uint64_t id);
  void failed(uint64_t id, const std::string& error);

  // Records oldest first, with this rank's identity and the wall-clock time.
  nlohmann::json to_json(int rank) const;
  // Writes to_json(rank) to `path` atomically.
  void dump(const std::filesystem::path& path, int rank) const;
  // Dumps to $BRIGADE_FLIGHT_RECORDER_DIR/flight_recorder_rank<R>.json if that
  // variable is set (brigade launch and the trainer set it to the run
  // directory); returns the path written, or empty. Called on every
  // communication error, so the evidence survives the process.
  std::filesystem::path dump_to_run_dir(int rank) const;

 private:
  FlightRecord* find(uint64_t id);  // null once the record has been overwritten

  size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<FlightRecord> ring_;
  uint64_t next_id_ = 1;
};

const char* op_state_name(OpState state);

// Dumps the process's recorder to the run directory (dump_to_run_dir) each
// time the process gets `signal` (SIGUSR1 by convention): how an operator
// asks a live, possibly hung, job where every rank is. A watcher thread does
// the writing, so it works while the training thread is stuck in a
// collective. Call once per process.
void dump_flight_recorder_on_signal(int signal, int rank);

}  // namespace brigade

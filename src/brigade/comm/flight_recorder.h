// The flight recorder: every rank remembers its last few thousand
// operations, so that when a job hangs or a peer dies, each rank can say
// which operation it was in, how far it got, and since when. Comparing the
// ranks' dumps of one group (different last sequence numbers, or one rank
// still "started" where the others completed) is how a hang is traced to the
// rank that caused it; diag/ will do that comparison.
//
// One recorder per process, shared by all of its communicators. Each
// communicator registers its group (name, this process's rank in it, and the
// world rank of every member) and records under it; a dump writes one file
// per group, named by world rank and group, so the several groups of a
// process (the hierarchical backend's node, leaders and point-to-point
// groups; dp, tp and pp groups) and the processes of a job never overwrite
// each other's files in one run directory:
//
//   flight_recorder_rank<world rank>_<group>.json
//
// (the group name with any character outside [A-Za-z0-9._-] replaced by
// '_'). A group re-created under the same name in one process takes over its
// file. The file holds the group's identity and its records oldest first.
//
// Record keys. Collectives and point-to-point operations are numbered by
// separate counters within a group (every rank numbers a group's collectives
// alike, which is what makes dumps comparable; sends and recvs complete in
// their own order), so a record is identified by (group, kind, seq), kind
// "collective" or "p2p"; each record carries it as "key":
// "<group>/collective/<seq>" or "<group>/p2p/<seq>". Within one file every
// key is unique; across a run directory, (world rank, key) is.
//
// Recording is a mutex and a few stores per operation: nothing next to the
// cost of a collective.
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
enum class RecordKind { kCollective, kPointToPoint };

// Who a group's records belong to.
struct FlightGroup {
  std::string name;          // the communicator's group name
  int rank = 0;              // this process's rank in the group
  int size = 1;              // the group's size
  std::vector<int> members;  // the world rank of each group rank
  int world_rank() const { return members[static_cast<size_t>(rank)]; }
};

// The members of a group from a communicator's options: `world_ranks` lists
// the world rank of each group rank, or is empty for a group whose ranks are
// the world ranks (the world group itself). Throws Error naming the backend
// and group if the list does not have one distinct, non-negative rank per
// group rank.
std::vector<int> group_members(std::string_view backend, std::string_view group, int size,
                               std::vector<int> world_ranks);

struct FlightRecord {
  uint64_t id = 0;     // process-wide, increasing
  uint32_t group = 0;  // FlightRecorder::GroupId
  RecordKind kind = RecordKind::kCollective;
  uint64_t seq = 0;   // the operation's number among its group's operations of its kind
  std::string op;     // "shm all_reduce(count 1024, f32, sum)"
  int64_t bytes = 0;  // this rank's operand size
  OpState state = OpState::kScheduled;
  int64_t scheduled_ns = 0, started_ns = 0, finished_ns = 0;  // steady clock
  std::string error;                                          // for kFailed
};

class FlightRecorder {
 public:
  using GroupId = uint32_t;

  explicit FlightRecorder(size_t capacity = 4096);

  // The process's recorder.
  static FlightRecorder& global();

  // Registers a group; its records and its dump go under the returned id,
  // which stays valid for the process's life (a group costs a few hundred
  // bytes, kept so late records of a destroyed communicator still land).
  GroupId add_group(FlightGroup group);
  // The group's communicator is gone: its file is written only while some of
  // its records are still in the ring.
  void close_group(GroupId group);

  // Records a queued operation; returns its id for the updates below. The
  // backend is named before the operation ("shm all_reduce(...)"); a
  // `started` one (run inline by its caller) is marked started at once.
  // Reuses the ring slot's strings, so recording allocates nothing once the
  // ring has wrapped.
  uint64_t scheduled(GroupId group, RecordKind kind, uint64_t seq, std::string_view backend,
                     std::string_view op, int64_t bytes, bool started = false);
  void started(uint64_t id);
  void completed(uint64_t id);
  void failed(uint64_t id, const std::string& error);

  // The group's identity and its records oldest first, with the wall-clock time.
  nlohmann::json to_json(GroupId group) const;
  // For a trace (diag/trace.h): the records scheduled at or after
  // `since_ns`, oldest first, each with its group's name. `*complete` is
  // false when the ring had already overwritten some of them (a window
  // longer than the ring holds).
  struct Named {
    std::string group;
    FlightRecord record;
  };
  std::vector<Named> records_since(int64_t since_ns, bool* complete) const;
  // "flight_recorder_rank<world rank>_<group>.json".
  std::string file_name(GroupId group) const;
  // Writes to_json(group) to `path` atomically.
  void dump(const std::filesystem::path& path, GroupId group) const;
  // Writes file_name(g) under $BRIGADE_FLIGHT_RECORDER_DIR for every group g
  // that is open or still has records, if that variable is set (brigade
  // launch and the trainer set it to the run directory); returns the paths
  // written, or none. Called on every communication error, so the evidence of
  // all the process's groups survives it.
  std::vector<std::filesystem::path> dump_to_run_dir() const;
  // The same files under `dir` (created if missing): where the agent asks
  // for them at an incident (elastic/heartbeat.h), whatever the variable says.
  std::vector<std::filesystem::path> dump_to_dir(const std::filesystem::path& dir) const;

 private:
  struct Group {
    FlightGroup identity;
    bool open = true;
  };
  FlightRecord* find(uint64_t id);  // null once the record has been overwritten
  std::string file_name_locked(GroupId group) const;
  nlohmann::json to_json_locked(GroupId group) const;

  size_t capacity_;
  mutable std::mutex mutex_;
  mutable std::mutex dump_mutex_;  // held while dump files are written
  std::vector<FlightRecord> ring_;
  std::vector<Group> groups_;
  uint64_t next_id_ = 1;
};

const char* op_state_name(OpState state);
const char* record_kind_name(RecordKind kind);  // "collective", "p2p"

// Dumps the process's recorder to the run directory (dump_to_run_dir) each
// time the process gets `signal` (SIGUSR1 by convention): how an operator
// asks a live, possibly hung, job where every rank is. A watcher thread does
// the writing, so it works while the training thread is stuck in a
// collective. `world_rank` names the process in what it prints. Call once per
// process.
void dump_flight_recorder_on_signal(int signal, int world_rank);

}  // namespace brigade

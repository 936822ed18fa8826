#include "brigade/comm/flight_recorder.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <thread>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {

const char* op_state_name(OpState state) {
  switch (state) {
    case OpState::kScheduled:
      return "scheduled";
    case OpState::kStarted:
      return "started";
    case OpState::kCompleted:
      return "completed";
    case OpState::kFailed:
      return "failed";
  }
  return "?";
}

const char* record_kind_name(RecordKind kind) {
  return kind == RecordKind::kCollective ? "collective" : "p2p";
}

std::vector<int> group_members(std::string_view backend, std::string_view group, int size,
                               std::vector<int> world_ranks) {
  if (world_ranks.empty()) {
    for (int r = 0; r < size; ++r) world_ranks.push_back(r);
    return world_ranks;
  }
  if (world_ranks.size() != static_cast<size_t>(size)) {
    throw_error(
        "{} group '{}': world_ranks lists {} ranks for a group of size {}: give the world rank "
        "of every group rank in order, or none for a group whose ranks are the world's",
        backend, group, world_ranks.size(), size);
  }
  std::set<int> seen;
  for (int r : world_ranks) {
    if (r < 0 || !seen.insert(r).second) {
      throw_error(
          "{} group '{}': world_ranks has {} world rank {}: each group rank needs its own "
          "non-negative world rank",
          backend, group, r < 0 ? "the negative" : "twice the", r);
    }
  }
  return world_ranks;
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {
  ring_.resize(capacity_);
}

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder recorder;
  return recorder;
}

FlightRecorder::GroupId FlightRecorder::add_group(FlightGroup group) {
  BRIGADE_CHECK(group.rank >= 0 && group.rank < group.size &&
                    group.members.size() == static_cast<size_t>(group.size),
                "group '{}': rank {} of {} with {} members", group.name, group.rank, group.size,
                group.members.size());
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(Group{std::move(group), true});
  return static_cast<GroupId>(groups_.size() - 1);
}

void FlightRecorder::close_group(GroupId group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.at(group).open = false;
}

uint64_t FlightRecorder::scheduled(GroupId group, RecordKind kind, uint64_t seq,
                                   std::string_view backend, std::string_view op, int64_t bytes,
                                   bool started) {
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  BRIGADE_CHECK(group < groups_.size(), "flight recorder group {} was never added", group);
  const uint64_t id = next_id_++;
  FlightRecord& r = ring_[id % capacity_];
  r.id = id;
  r.group = group;
  r.kind = kind;
  r.seq = seq;
  r.op.clear();
  if (!backend.empty()) r.op.append(backend).append(" ");
  r.op.append(op);
  r.bytes = bytes;
  r.state = started ? OpState::kStarted : OpState::kScheduled;
  r.scheduled_ns = now;
  r.started_ns = started ? now : 0;
  r.finished_ns = 0;
  r.error.clear();
  return id;
}

FlightRecord* FlightRecorder::find(uint64_t id) {
  FlightRecord& r = ring_[id % capacity_];
  return r.id == id ? &r : nullptr;
}

void FlightRecorder::started(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightRecord* r = find(id)) {
    r->state = OpState::kStarted;
    r->started_ns = now_ns();
  }
}

void FlightRecorder::completed(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightRecord* r = find(id)) {
    r->state = OpState::kCompleted;
    r->finished_ns = now_ns();
  }
}

void FlightRecorder::failed(uint64_t id, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightRecord* r = find(id)) {
    r->state = OpState::kFailed;
    r->finished_ns = now_ns();
    r->error = error;
  }
}

nlohmann::json FlightRecorder::to_json(GroupId group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return to_json_locked(group);
}

std::vector<FlightRecorder::Named> FlightRecorder::records_since(int64_t since_ns,
                                                                 bool* complete) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Named> out;
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  // The oldest record kept is already inside the window: older ones of the
  // window may have been overwritten.
  *complete = first == 1 || ring_[first % capacity_].scheduled_ns < since_ns;
  for (uint64_t id = first; id < next_id_; ++id) {
    const FlightRecord& r = ring_[id % capacity_];
    if (r.scheduled_ns < since_ns) continue;
    out.push_back({groups_.at(r.group).identity.name, r});
  }
  return out;
}

nlohmann::json FlightRecorder::to_json_locked(GroupId group) const {
  const FlightGroup& identity = groups_.at(group).identity;
  const int64_t now = now_ns();
  nlohmann::json records = nlohmann::json::array();
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  for (uint64_t id = first; id < next_id_; ++id) {
    const FlightRecord& r = ring_[id % capacity_];
    if (r.group != group) continue;
    // Times as "ms before the dump", which compare across ranks without a
    // shared clock.
    auto ago_ms = [&](int64_t t) {
      return t == 0 ? nlohmann::json() : nlohmann::json((now - t) * 1e-6);
    };
    const char* kind = record_kind_name(r.kind);
    nlohmann::json j = {{"id", r.id},
                        {"key", identity.name + "/" + kind + "/" + std::to_string(r.seq)},
                        {"group", identity.name},
                        {"kind", kind},
                        {"seq", r.seq},
                        {"op", r.op},
                        {"bytes", r.bytes},
                        {"state", op_state_name(r.state)},
                        {"scheduled_ms_ago", ago_ms(r.scheduled_ns)},
                        {"started_ms_ago", ago_ms(r.started_ns)},
                        {"finished_ms_ago", ago_ms(r.finished_ns)}};
    if (!r.error.empty()) j["error"] = r.error;
    records.push_back(std::move(j));
  }
  const auto wall = std::chrono::system_clock::now().time_since_epoch();
  return {
      {"world_rank", identity.world_rank()},
      {"pid", ::getpid()},
      {"group",
       {{"name", identity.name},
        {"rank", identity.rank},
        {"size", identity.size},
        {"members", identity.members}}},
      {"dumped_at_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(wall).count()},
      // The same to the microsecond, for a timeline of an incident's dumps
      // (diag/incident_trace.h).
      {"dumped_at_unix_us", std::chrono::duration_cast<std::chrono::microseconds>(wall).count()},
      {"records", std::move(records)}};
}

std::string FlightRecorder::file_name(GroupId group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_name_locked(group);
}

std::string FlightRecorder::file_name_locked(GroupId group) const {
  const FlightGroup& identity = groups_.at(group).identity;
  std::string name = identity.name;
  for (char& c : name) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    if (!plain) c = '_';
  }
  return "flight_recorder_rank" + std::to_string(identity.world_rank()) + "_" + name + ".json";
}

void FlightRecorder::dump(const std::filesystem::path& path, GroupId group) const {
  write_file_atomic(path, to_json(group).dump(1) + "\n");
}

std::vector<std::filesystem::path> FlightRecorder::dump_to_run_dir() const {
  const char* dir = std::getenv("BRIGADE_FLIGHT_RECORDER_DIR");
  if (dir == nullptr || *dir == '\0') return {};
  return dump_to_dir(dir);
}

std::vector<std::filesystem::path> FlightRecorder::dump_to_dir(
    const std::filesystem::path& dir) const {
  // Render under the lock, write after it: recording must not wait on disks.
  std::vector<std::pair<std::filesystem::path, std::string>> files;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::set<GroupId> recorded;
    const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
    for (uint64_t id = first; id < next_id_; ++id) recorded.insert(ring_[id % capacity_].group);
    std::set<std::string> taken;
    // Newest first: a group re-created under the same name takes over its file.
    for (GroupId g = static_cast<GroupId>(groups_.size()); g-- > 0;) {
      if (!groups_[g].open && recorded.count(g) == 0) continue;
      std::string name = file_name_locked(g);
      if (!taken.insert(name).second) continue;
      files.emplace_back(dir / name, to_json_locked(g).dump(1) + "\n");
    }
  }
  // Threads that fail together (a dead peer breaks several groups at once)
  // or the SIGUSR1 watcher dump the same files: one writer at a time, or
  // their temporary files (named by pid) would interleave.
  std::lock_guard<std::mutex> writing(dump_mutex_);
  std::vector<std::filesystem::path> written;
  if (!files.empty()) std::filesystem::create_directories(dir);
  for (const auto& [path, text] : files) {
    write_file_atomic(path, text);
    written.push_back(path);
  }
  return written;
}

namespace {
std::atomic<int> g_dump_requests{0};
void count_dump_request(int) {
  g_dump_requests.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void dump_flight_recorder_on_signal(int signal, int world_rank) {
  // The handler only counts (async-signal-safe); the thread writes.
  std::signal(signal, count_dump_request);
  std::thread([rank = world_rank] {
    int handled = 0;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int requested = g_dump_requests.load(std::memory_order_relaxed);
      if (requested == handled) continue;
      handled = requested;
      try {
        const auto paths = FlightRecorder::global().dump_to_run_dir();
        if (paths.empty()) {
          std::fprintf(stderr,
                       "rank %d: flight recorder not written: BRIGADE_FLIGHT_RECORDER_DIR is not "
                       "set, or no group has recorded anything\n",
                       rank);
        }
        for (const auto& path : paths) {
          std::fprintf(stderr, "rank %d: flight recorder written to %s\n", rank, path.c_str());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: flight recorder dump failed: %s\n", rank, e.what());
      }
    }
  }).detach();
}

}  // namespace brigade

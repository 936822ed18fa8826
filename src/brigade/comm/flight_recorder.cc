#include "brigade/comm/flight_recorder.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "brigade/core/clock.h"
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

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {
  ring_.resize(capacity_);
}

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder recorder;
  return recorder;
}

uint64_t FlightRecorder::scheduled(std::string_view group, uint64_t seq, std::string_view backend,
                                   std::string_view op, int64_t bytes, bool started) {
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  FlightRecord& r = ring_[id % capacity_];
  r.id = id;
  r.group.assign(group);
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

nlohmann::json FlightRecorder::to_json(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = now_ns();
  nlohmann::json records = nlohmann::json::array();
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  for (uint64_t id = first; id < next_id_; ++id) {
    const FlightRecord& r = ring_[id % capacity_];
    // Times as "ms before the dump", which compare across ranks without a
    // shared clock.
    auto ago_ms = [&](int64_t t) {
      return t == 0 ? nlohmann::json() : nlohmann::json((now - t) * 1e-6);
    };
    nlohmann::json j = {{"id", r.id},
                        {"group", r.group},
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
      {"rank", rank},
      {"pid", ::getpid()},
      {"dumped_at_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(wall).count()},
      {"records", std::move(records)}};
}

void FlightRecorder::dump(const std::filesystem::path& path, int rank) const {
  write_file_atomic(path, to_json(rank).dump(1) + "\n");
}

std::filesystem::path FlightRecorder::dump_to_run_dir(int rank) const {
  const char* dir = std::getenv("BRIGADE_FLIGHT_RECORDER_DIR");
  if (dir == nullptr || *dir == '\0') return {};
  const std::filesystem::path path =
      std::filesystem::path(dir) / ("flight_recorder_rank" + std::to_string(rank) + ".json");
  dump(path, rank);
  return path;
}

namespace {
std::atomic<int> g_dump_requests{0};
void count_dump_request(int) {
  g_dump_requests.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void dump_flight_recorder_on_signal(int signal, int rank) {
  // The handler only counts (async-signal-safe); the thread writes.
  std::signal(signal, count_dump_request);
  std::thread([rank] {
    int handled = 0;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int requested = g_dump_requests.load(std::memory_order_relaxed);
      if (requested == handled) continue;
      handled = requested;
      try {
        const auto path = FlightRecorder::global().dump_to_run_dir(rank);
        std::fprintf(
            stderr, "rank %d: flight recorder written to %s\n", rank,
            path.empty() ? "(nowhere: BRIGADE_FLIGHT_RECORDER_DIR is not set)" : path.c_str());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: flight recorder dump failed: %s\n", rank, e.what());
      }
    }
  }).detach();
}

}  // namespace brigade

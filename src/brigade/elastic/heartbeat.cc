#include "brigade/elastic/heartbeat.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string_view>

#include "brigade/comm/flight_recorder.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/incidents.h"

namespace brigade::elastic {
namespace {

// One page per slot, so a worker maps its own slot and no other.
constexpr size_t kSlotStride = 4096;
static_assert(sizeof(HeartbeatSlot) <= kSlotStride);

int64_t env_int(const char* name, int64_t min_value) {
  const char* text = std::getenv(name);
  const std::string_view view = text != nullptr ? text : "";
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (view.empty() || ec != std::errc() || end != view.data() + view.size() || value < min_value) {
    throw_error(
        "environment variable {}='{}' is not an integer >= {}: it is set by the agent (brigade "
        "launch); do not set it by hand",
        name, view, min_value);
  }
  return value;
}

}  // namespace

HeartbeatTable::HeartbeatTable(int slots, int64_t generation) : slots_(slots) {
  if (slots < 1) throw_error("a heartbeat table needs at least one slot, got {}", slots);
  bytes_ = kSlotStride * static_cast<size_t>(slots);
  fd_ = ::memfd_create("brigade-heartbeat", MFD_CLOEXEC);
  if (fd_ < 0)
    throw_error("cannot create the heartbeat table (memfd_create): {}", std::strerror(errno));
  if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_error("cannot size the heartbeat table ({} bytes): {}", bytes_, std::strerror(err));
  }
  void* mapping = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    ::close(fd_);
    throw_error("cannot map the heartbeat table: {}", std::strerror(err));
  }
  auto* base = static_cast<char*>(mapping);
  table_ = reinterpret_cast<HeartbeatSlot*>(base);
  for (int i = 0; i < slots; ++i) {
    // The memfd's pages are zeros; the atomics are constructed over them.
    auto* slot = new (base + kSlotStride * static_cast<size_t>(i)) HeartbeatSlot{};
    slot->generation.store(generation);
    slot->start_step.store(-1);
    slot->loss.store(std::numeric_limits<double>::quiet_NaN());
    slot->tokens_per_s.store(std::numeric_limits<double>::quiet_NaN());
    slot->mfu.store(std::numeric_limits<double>::quiet_NaN());
    slot->comm_wait_fraction.store(std::numeric_limits<double>::quiet_NaN());
    for (auto& part : slot->part_ms) part.store(std::numeric_limits<double>::quiet_NaN());
  }
}

HeartbeatTable::~HeartbeatTable() {
  ::munmap(table_, bytes_);
  ::close(fd_);
}

HeartbeatSlot* HeartbeatTable::slot(int local_rank) const {
  if (local_rank < 0 || local_rank >= slots_) {
    throw_error("heartbeat slot {} is not in a table of {}", local_rank, slots_);
  }
  return reinterpret_cast<HeartbeatSlot*>(reinterpret_cast<char*>(table_) +
                                          kSlotStride * static_cast<size_t>(local_rank));
}

WorkerProgress HeartbeatTable::read(int local_rank) const {
  const HeartbeatSlot* slot = this->slot(local_rank);
  WorkerProgress p;
  p.generation = slot->generation.load();
  p.pid = slot->pid.load();
  p.beat_ns = slot->beat_ns.load();
  p.start_step = slot->start_step.load();
  p.step = slot->step.load();
  p.step_ns = slot->step_ns.load();
  p.first_step_ns = slot->first_step_ns.load();
  p.train_ns = slot->train_ns.load();
  p.fault_ns = slot->fault_ns.load();
  p.last_step_ns = slot->last_step_ns.load();
  p.stats.loss = slot->loss.load();
  p.stats.tokens_per_s = slot->tokens_per_s.load();
  p.stats.mfu = slot->mfu.load();
  p.stats.comm_wait_fraction = slot->comm_wait_fraction.load();
  for (int i = 0; i < kStepParts; ++i) p.stats.part_ms[i] = slot->part_ms[i].load();
  p.dump_done = slot->dump_done.load();
  p.mesh_ns = slot->mesh_ns.load();
  p.ready_ns = slot->ready_ns.load();
  p.peak_gflops = slot->peak_gflops.load();
  const int64_t run_dir_bytes = slot->run_dir_bytes.load(std::memory_order_acquire);
  if (run_dir_bytes > 0 && run_dir_bytes <= static_cast<int64_t>(kMaxRunDirBytes)) {
    p.run_dir.assign(slot->run_dir, static_cast<size_t>(run_dir_bytes));
  }
  return p;
}

void HeartbeatTable::request_dump(int local_rank, int64_t incident) const {
  slot(local_rank)->dump_request.store(incident);
}

void HeartbeatTable::stamp_fault(int local_rank, int64_t ns) const {
  slot(local_rank)->fault_ns.store(ns);
}

void HeartbeatTable::hold_after(int64_t step) const {
  for (int r = 0; r < slots_; ++r) {
    slot(r)->hold_after_step.store(step);
  }
}

std::unique_ptr<WorkerHeartbeat> WorkerHeartbeat::from_environment() {
  if (std::getenv("BRIGADE_HEARTBEAT_FD") == nullptr) return nullptr;
  const int fd = static_cast<int>(env_int("BRIGADE_HEARTBEAT_FD", 0));
  const int local_rank = static_cast<int>(env_int("LOCAL_RANK", 0));
  const int64_t generation = env_int("BRIGADE_GENERATION", 0);
  return std::make_unique<WorkerHeartbeat>(fd, local_rank, generation);
}

WorkerHeartbeat::WorkerHeartbeat(int fd, int local_rank, int64_t generation)
    : generation_(generation) {
  mapping_bytes_ = kSlotStride;
  mapping_ = ::mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(kSlotStride * static_cast<size_t>(local_rank)));
  const int err = errno;
  ::close(fd);  // the mapping stays; this worker's own children get nothing
  if (mapping_ == MAP_FAILED) {
    throw_error(
        "cannot map heartbeat slot {} (BRIGADE_HEARTBEAT_FD={}): {}; the variable is set by the "
        "agent for its workers only",
        local_rank, fd, std::strerror(err));
  }
  slot_ = static_cast<HeartbeatSlot*>(mapping_);
  const int64_t table_generation = slot_->generation.load();
  if (table_generation != generation) {
    ::munmap(mapping_, mapping_bytes_);
    throw_error(
        "this worker belongs to generation {} but its heartbeat table to generation {}: a stale "
        "worker must not join a newer generation",
        generation, table_generation);
  }
  slot_->pid.store(::getpid());
  slot_->beat_ns.store(now_ns());
  thread_ = std::thread([this] { beat_loop(); });
}

WorkerHeartbeat::~WorkerHeartbeat() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::munmap(mapping_, mapping_bytes_);
}

void WorkerHeartbeat::beat_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  int64_t next_beat_ns = 0;
  while (!stop_) {
    const int64_t now = now_ns();
    if (now >= next_beat_ns) {
      slot_->beat_ns.store(now);
      next_beat_ns = now + kHeartbeatIntervalMs * 1'000'000;
    }
    if (slot_->dump_request.load() > slot_->dump_done.load()) answer_dump_request();
    wake_.wait_for(lock, std::chrono::milliseconds(kDumpPollMs), [this] { return stop_; });
  }
}

void WorkerHeartbeat::answer_dump_request() {
  const int64_t incident = slot_->dump_request.load();
  // Before started() there is no run directory and nothing recorded yet:
  // answered all the same, so the agent does not wait for it.
  if (slot_->start_step.load() >= 0 && !run_dir_.empty()) {
    try {
      FlightRecorder::global().dump_to_dir(incident_dir(run_dir_, incident));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "brigade train: flight recorder for incident %lld not written: %s\n",
                   static_cast<long long>(incident), e.what());
    }
  }
  slot_->dump_done.store(incident);
}

void WorkerHeartbeat::machine_peak(double gflops) {
  slot_->peak_gflops.store(gflops);
}

void WorkerHeartbeat::mesh_formed() {
  slot_->mesh_ns.store(now_ns());
}

void WorkerHeartbeat::started(int64_t step, const std::string& run_dir) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    run_dir_ = run_dir;
  }
  const size_t bytes = std::min(run_dir.size(), kMaxRunDirBytes);
  std::memcpy(slot_->run_dir, run_dir.data(), bytes);
  slot_->run_dir_bytes.store(run_dir.size() <= kMaxRunDirBytes ? static_cast<int64_t>(bytes) : 0,
                             std::memory_order_release);
  const int64_t now = now_ns();
  slot_->step.store(step);
  slot_->step_ns.store(now);
  slot_->ready_ns.store(now);
  slot_->start_step.store(step);
}

void WorkerHeartbeat::step_done(int64_t step, int64_t step_ns, int64_t training_ns) {
  const int64_t now = now_ns();
  slot_->train_ns.fetch_add(training_ns);
  slot_->last_step_ns.store(step_ns);
  slot_->step_ns.store(now);
  slot_->step.store(step);
  if (!first_step_done_) {
    first_step_done_ = true;
    slot_->first_step_ns.store(now);
  }
  while (slot_->hold_after_step.load() == step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void WorkerHeartbeat::step_stats(const StepStats& stats) {
  slot_->loss.store(stats.loss);
  slot_->tokens_per_s.store(stats.tokens_per_s);
  slot_->mfu.store(stats.mfu);
  slot_->comm_wait_fraction.store(stats.comm_wait_fraction);
  for (int i = 0; i < kStepParts; ++i) slot_->part_ms[i].store(stats.part_ms[i]);
}

void WorkerHeartbeat::fault_injected() {
  slot_->fault_ns.store(now_ns());
}

}  // namespace brigade::elastic

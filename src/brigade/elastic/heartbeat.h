// Heartbeats from workers to their node's agent, through shared memory.
//
// For each generation the agent creates a table of one slot per local rank
// in a memfd, which only that generation's workers inherit (its number in
// BRIGADE_HEARTBEAT_FD; the slot is LOCAL_RANK's). A worker maps its slot
// and runs a thread that stamps the time into it about every 100 ms; its
// training loop records each completed step. The agent only reads, so a
// worker that dies or stops leaves a slot that simply stops changing:
//
//   - liveness: the heartbeat thread stops only when the whole process does
//     (SIGSTOP, a frozen machine, a debugger), so a silent slot is a hang
//     within the heartbeat timeout (elastic/watchdog.h);
//   - progress: a worker stuck in a collective still beats, but its step does
//     not move, which the much longer step timeout catches.
//
// Times are CLOCK_MONOTONIC nanoseconds (core/clock.h's now_ns), one clock
// for every process of the machine. The slot also carries what the agent
// needs to restart and account a `brigade train` run: the step it resumed
// from, the run directory, the time in training steps, and when an injected
// fault was raised (elastic/fault_injection.h), and the last step's numbers
// (loss, tokens/s, MFU, communication wait, step time) that the agent's
// /metrics endpoint serves (diag/prometheus.h). The agent treats every value
// as untrusted input: a worker bug must not crash it.
//
// At an incident the agent asks the live workers for their evidence through
// the slot before it kills them: it sets dump_request to the incident's
// number, and the heartbeat thread (which runs while training is stuck in a
// collective) writes the process's flight recorder to
// RUN_DIR/incidents/<number>/ (elastic/incident_evidence.h) and then sets
// dump_done to the same number. The thread looks every kDumpPollMs, so the
// agent's wait for the evidence stays a small part of the recovery.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "brigade/train/step_breakdown.h"

namespace brigade::elastic {

// How often a worker's heartbeat thread stamps its slot.
inline constexpr int64_t kHeartbeatIntervalMs = 100;
// How often the heartbeat thread looks for the agent's dump request.
inline constexpr int64_t kDumpPollMs = 10;
inline constexpr size_t kMaxRunDirBytes = 1024;

struct HeartbeatSlot {
  std::atomic<int64_t> generation;  // written by the agent before the worker starts
  std::atomic<int64_t> pid;
  std::atomic<int64_t> beat_ns;        // the last heartbeat; 0 before the first
  std::atomic<int64_t> start_step;     // the step this generation started from; -1 before
  std::atomic<int64_t> step;           // steps completed
  std::atomic<int64_t> step_ns;        // when `step` was reached (or start_step set)
  std::atomic<int64_t> first_step_ns;  // when this generation's first step completed; 0 before
  std::atomic<int64_t> train_ns;       // training time of this generation's steps (step_done)
  std::atomic<int64_t> fault_ns;       // when an injected fault was raised; 0 if none
  std::atomic<int64_t> run_dir_bytes;  // set after run_dir, with release order
  char run_dir[kMaxRunDirBytes];
  // The last step's numbers, for the agent's /metrics (diag/prometheus.h);
  // NaN until the worker reports them (last_step_ns: 0).
  std::atomic<int64_t> last_step_ns;
  std::atomic<double> loss;
  std::atomic<double> tokens_per_s;
  std::atomic<double> mfu;  // only the rank that measures it (rank 0)
  std::atomic<double> comm_wait_fraction;
  std::atomic<double> part_ms[kStepParts];
  // The agent's request for evidence (an incident number, from 1) and the
  // worker's answer once written; 0: none.
  std::atomic<int64_t> dump_request;
  std::atomic<int64_t> dump_done;
  // The phases of the worker's set-up, for the recovery time split
  // (elastic/incidents.h): when its communicators were connected (the
  // mesh formed) and when its state was loaded (training about to start);
  // 0 before.
  std::atomic<int64_t> mesh_ns;
  std::atomic<int64_t> ready_ns;
  // The machine's peak GFLOP/s per rank that rank 0 measured (0 before):
  // the agent passes it to later generations (kMachinePeakVariable), so a
  // restart does not measure it again.
  std::atomic<double> peak_gflops;
  // A whole-node fault falls due after this step (elastic/fault_injection.h,
  // NodeFault): the worker waits in step_done until the agent has raised it
  // and cleared this, so the fault strikes at that step however short the
  // steps are, not one agent tick later. 0: none. Written by the agent
  // before the worker starts.
  std::atomic<int64_t> hold_after_step;
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "slots are shared between processes");
static_assert(std::atomic<double>::is_always_lock_free, "slots are shared between processes");

// A worker's last step, as it reports it; NaN for what it does not know.
struct StepStats {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  double mfu = std::numeric_limits<double>::quiet_NaN();
  // The step's communication part over its time (train/step_breakdown.h:
  // collective waits overlap did not hide, the stop agreement and the
  // metrics gather).
  double comm_wait_fraction = std::numeric_limits<double>::quiet_NaN();
  // The step's parts in ms, by StepPart (train/step_breakdown.h).
  std::array<double, kStepParts> part_ms = nan_parts();
  static std::array<double, kStepParts> nan_parts() {
    std::array<double, kStepParts> parts;
    parts.fill(std::numeric_limits<double>::quiet_NaN());
    return parts;
  }
};

// A copy of one slot's values, as the agent saw them.
struct WorkerProgress {
  int64_t generation = 0;
  int64_t pid = 0;
  int64_t beat_ns = 0;
  int64_t start_step = -1;
  int64_t step = 0;
  int64_t step_ns = 0;
  int64_t first_step_ns = 0;
  int64_t train_ns = 0;
  int64_t fault_ns = 0;
  std::string run_dir;       // empty until the worker said
  int64_t last_step_ns = 0;  // the last step's duration; 0 before the first
  StepStats stats;
  int64_t dump_done = 0;  // the last incident whose evidence this worker wrote
  int64_t mesh_ns = 0;
  int64_t ready_ns = 0;
  double peak_gflops = 0;
};

// The environment variable through which the agent gives a restarted
// generation the machine peak its first generation measured.
inline constexpr const char* kMachinePeakVariable = "BRIGADE_MACHINE_PEAK";

// The agent's side: one table per generation.
class HeartbeatTable {
 public:
  // Throws Error if the memfd cannot be created or mapped.
  HeartbeatTable(int slots, int64_t generation);
  ~HeartbeatTable();
  HeartbeatTable(const HeartbeatTable&) = delete;
  HeartbeatTable& operator=(const HeartbeatTable&) = delete;

  // Close-on-exec in the agent; WorkerGroup clears that in its workers only.
  int fd() const { return fd_; }
  int slots() const { return slots_; }
  WorkerProgress read(int local_rank) const;
  // Asks the worker to write its flight recorder for `incident` (see above).
  void request_dump(int local_rank, int64_t incident) const;
  // The agent raises a fault on the worker itself (chaos,
  // elastic/fault_injection.h): stamped as the worker stamps its own.
  void stamp_fault(int local_rank, int64_t ns) const;
  // Every worker waits after completing `step` until hold_after(0) (see
  // HeartbeatSlot::hold_after_step).
  void hold_after(int64_t step) const;

 private:
  // Throws Error for a slot outside the table.
  HeartbeatSlot* slot(int local_rank) const;

  int fd_ = -1;
  int slots_ = 0;
  size_t bytes_ = 0;
  HeartbeatSlot* table_ = nullptr;
};

// The worker's side: its slot and the thread that beats.
class WorkerHeartbeat {
 public:
  // From BRIGADE_HEARTBEAT_FD, LOCAL_RANK and BRIGADE_GENERATION; null when
  // the worker was not started by an agent (no BRIGADE_HEARTBEAT_FD). Throws
  // Error for a malformed variable or a table of another generation.
  static std::unique_ptr<WorkerHeartbeat> from_environment();
  // Maps slot `local_rank` of the table behind `fd` (closing fd) and starts beating.
  WorkerHeartbeat(int fd, int local_rank, int64_t generation);
  ~WorkerHeartbeat();
  WorkerHeartbeat(const WorkerHeartbeat&) = delete;
  WorkerHeartbeat& operator=(const WorkerHeartbeat&) = delete;

  int64_t generation() const { return generation_; }
  // The worker's communicators are connected.
  void mesh_formed();
  // The machine's peak GFLOP/s per rank, as measured (or received).
  void machine_peak(double gflops);
  // Training is set up at `step` (0, or the checkpoint resumed from), in
  // `run_dir`: the state is loaded and the next thing is the first step.
  void started(int64_t step, const std::string& run_dir);
  // Step `step` (counted from 1) completed. step_ns: the trainer's step,
  // forward to update (the /metrics gauge, an incident's evidence);
  // training_ns: what the ETTR counts as its training time
  // (HeartbeatSlot::train_ns, elastic/incidents.h), its window on the
  // loop's clock less saves and evaluations, which is usually longer.
  // Returns once the agent lets the worker go on
  // (HeartbeatSlot::hold_after_step).
  void step_done(int64_t step, int64_t step_ns, int64_t training_ns);
  // The numbers of the step about to be reported by step_done.
  void step_stats(const StepStats& stats);
  // Just before this worker raises an injected fault on itself.
  void fault_injected();

 private:
  void beat_loop();
  void answer_dump_request();

  int64_t generation_ = 0;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  HeartbeatSlot* slot_ = nullptr;
  bool first_step_done_ = false;
  std::string run_dir_;  // as started() said; written before start_step, read by the thread
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace brigade::elastic

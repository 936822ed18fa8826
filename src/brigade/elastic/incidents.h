// What the agent records about failures: one Incident per failure, written
// to RUN_DIR/incidents.jsonl once it is resolved (the job's first step after
// the restart, or the end), and a summary of the run with its effective
// training time ratio (ETTR) at the end.
//
// ETTR = productive training time / wall time. Productive time is the
// training time of the steps the final result keeps: each generation's
// training time (from its heartbeats) times the fraction of its steps that
// the next generation did not have to redo. A step's training time is its
// whole window on the training loop's clock (cli/cmd_train.cc: from just
// before the previous step's gather of rank stats to just before its own), the loop's work
// between steps included, less the time it spent on saves (snapshots and
// checkpoints) and evaluations. Everything else (start-up, detection,
// restarts, loading checkpoints, redone steps, saves and evaluations) is
// the difference to wall time.
//
// Why the loop's own time between steps counts (until session 17 only the
// trainer's step, forward to update, did): it is what a run without faults
// takes too, as the time a step waits for a slow peer inside its gradient
// all-reduce is. Counting it lost scored a fault-free run of the chaos
// layout (3 namespace nodes on 2 cores) 92-93%, and moving the one
// collective between steps into the next step (branch `lag`) raised that
// to 97.5% with the loop's time unchanged: the old count measured where
// the ranks' drift was absorbed, not what faults cost (docs/PERFORMANCE.md).
// The saves stay lost time, as the failure model's checkpoint cost. What
// else falls in a window counts with it: a NaN step's re-run, an injected
// slow factor's sleep, writing the trace.
//
// A recovered incident's time splits into five phases, each from real time
// stamps on the one monotonic clock of the machine:
//   detect      the fault (its own stamp if injected) to the agent's verdict
//   stop        the verdict to every worker of the generation reaped (the
//               evidence is gathered first; across nodes, every node's)
//   rendezvous  to the new generation's mesh formed (its last worker's
//               communicators connected: process start, set-up, connect)
//   load        to its last worker's state loaded (model built, snapshot or
//               checkpoint read and resharded)
//   first step  to its last worker's first completed step
// The new generation's stamps are its workers' own (elastic/heartbeat.h),
// this node's on a multi-node job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace brigade::elastic {

struct Incident {
  // "crash", "hang", "node_lost" or "partition", as the agents saw it;
  // "store_lost": a node's agent lost the coordinator's store for longer
  // than a call and stopped its workers, then reached it again in time to
  // restart in place; or "rejoin": the job stopped to grow back, which is
  // no failure.
  std::string kind;
  bool failure() const { return kind != "rejoin"; }
  int rank = 0;
  int node = 0;  // the node of the worker (or the node that was lost)
  int64_t pid = 0;
  std::optional<int> signal;     // the signal that ended a crashed worker
  std::optional<int> exit_code;  // or its non-zero exit status
  int64_t generation = 0;
  std::string what;  // for people: "worker rank 1 (local 1, node 0) was killed by SIGKILL"
  // When the fault happened: an injected fault's own time stamp, else the
  // worker's last heartbeat (crash) or the last sign of progress (hang).
  int64_t fault_ns = 0;
  bool injected = false;
  int64_t detected_ns = 0;
  // The highest step the job completed before the fault (in this or an
  // earlier generation: steps lost count from there).
  int64_t last_step = 0;
  // A step's mean training time in the failed generation (the ETTR's count,
  // below): what each redone step costs in lost_s.
  double mean_step_ms = 0;
  // The nodes the job went on with after this incident, when it went on
  // with fewer (`--nnodes MIN:MAX`, no standby free); 0: as many as before.
  int nodes = 0;
  // Filled in by the next generation: the step it resumed from and when
  // its first step completed.
  std::optional<int64_t> resumed_from_step;
  std::optional<int64_t> recovered_ns;
  // The phases between (see above): every worker stopped, the new mesh
  // formed, the new state loaded; 0 unknown.
  int64_t stopped_ns = 0;
  int64_t mesh_ns = 0;
  int64_t ready_ns = 0;
  // The root cause from the evidence (diag/root_cause.h's line), and how long
  // gathering the evidence delayed the restart.
  std::string cause;
  double evidence_ms = 0;
  bool written = false;

  double detected_after_ms() const { return (detected_ns - fault_ns) * 1e-6; }
  std::optional<double> recovered_after_ms() const;
  std::optional<int64_t> steps_lost() const;
  // The five phases in ms (see above); each null where a stamp is missing
  // or out of order.
  struct RecoverySplit {
    std::optional<double> detect, stop, rendezvous, load, first_step;
  };
  RecoverySplit recovery_split() const;
  // "detect 12 ms, stop 40 ms, rendezvous 300 ms, load 90 ms, first step 30 ms"
  std::string recovery_line() const;
  nlohmann::json to_json() const;
};

// One generation's steps, from its workers' heartbeats.
struct GenerationRecord {
  int64_t start_step = -1;  // -1: never got as far as training
  int64_t last_step = 0;
  int64_t train_ns = 0;
  int64_t ready_ns = 0;     // training set up (0: never)
  int64_t step_end_ns = 0;  // its last step completed (0: none)
};

// The job's progress across generations, as one agent saw it: an
// incident's steps lost count from the highest step the job completed, so
// a generation that failed during its restart (before its first step)
// still loses the steps the one before it had done when the next resumes
// from further back, at the pace of the last generation that stepped.
struct JobProgress {
  int64_t highest_step = 0;
  double mean_step_ms = 0;
  // A generation ended having completed `last_step`.
  void saw(int64_t last_step);
  // A failed generation's incident, its last_step and mean_step_ms its
  // own workers', becomes the job's.
  void account(Incident& incident);
};

struct RunSummary {
  int incidents = 0;  // failures
  // Times the job grew back (a node rejoined): each stopped the job, so its
  // time counts in lost_s, but nothing failed and no restart was used.
  int rejoins = 0;
  int restarts = 0;
  double wall_s = 0;
  double productive_s = 0;
  // Per incident: fault to the next generation's first step (or the end),
  // plus the time of the steps redone.
  double lost_s = 0;
  double ettr = 0;
  // From the first generation's training set up to the last completed
  // step: the wall time the planner's failure model speaks of (it leaves
  // out the first start-up and the end), 0 when unknown.
  double training_s = 0;
  nlohmann::json to_json() const;
  std::string line() const;  // for stderr
};

// Generation `generation` set up at `start_step` (its slot 0's; -1: not
// yet): the previous generation's incident, if not told yet, resumed from
// there. Its steps redone count as lost even when the next failure
// overtook its recovery.
void note_resumed_from(std::vector<Incident>& incidents, int64_t generation, int64_t start_step);

RunSummary summarize(const std::vector<Incident>& incidents,
                     const std::vector<GenerationRecord>& generations, int restarts,
                     int64_t start_ns, int64_t end_ns);

// Where the evidence of incident `number` (from 1) goes:
// RUN_DIR/incidents/<number>/ (elastic/incident_evidence.h).
std::filesystem::path incident_dir(const std::filesystem::path& run_dir, int64_t number);

// Appends one JSON line to `path` (creating it). Throws Error if it cannot.
void append_json_line(const std::filesystem::path& path, const nlohmann::json& line);

}  // namespace brigade::elastic

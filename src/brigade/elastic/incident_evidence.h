// What the agent leaves in RUN_DIR/incidents/<N>/ when a generation fails,
// before it kills the survivors, for diag/root_cause.h to read (at once,
// through the launcher's hook, and later with `brigade diagnose RUN_DIR`):
//
//   agent_node<k>.json  node k's agent's view (one file per node: the run
//                directory is shared by every node's agent): the incident
//                as it detected it, and for every worker of the node its
//                rank, pid, whether it still ran, how it ended (exit code or
//                signal), and its heartbeat slot at that moment (heartbeat
//                and step ages, step, last step time);
//   sdc_rank<R>_step<S>.json  a worker's report of a failed replica check
//                (train/silent_corruption.h), moved from the run directory
//                when its pid is the worker's;
//   flight_recorder_rank<R>_<group>.json  every live worker's flight
//                recorder (comm/flight_recorder.h), written by the worker on
//                the agent's request (elastic/heartbeat.h); for a worker that
//                had already exited, the dump it left in the run directory
//                on its communication error, if it is this process's.
//
// A worker that is stopped or frozen cannot answer; the agent asks only
// workers whose heartbeat is fresh and waits at most kEvidenceWaitMs for
// them, then kills the generation as before: the evidence costs the restart
// one poll of the heartbeat thread and one write of a few JSON files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incidents.h"
#include "brigade/elastic/worker_group.h"

namespace brigade::elastic {

// Node `node`'s agent view in an incident's directory.
std::string agent_view_file(int node);
// The longest the agent waits for the live workers' dumps.
inline constexpr int64_t kEvidenceWaitMs = 1'000;
// A worker whose last heartbeat is older than this is not asked (stopped or
// frozen: it could not answer); ten missed beats.
inline constexpr int64_t kAnswerableBeatMs = 1'000;

struct WorkerView {
  int rank = 0;
  int local_rank = 0;
  int64_t pid = 0;
  bool running = false;
  std::optional<int> exit_code;  // ended: its status, or the signal that ended it
  std::optional<int> signal;
  bool dumped = false;  // its flight recorder is in the incident's directory
  // The kernel holds it stopped by a signal (elastic/watchdog.h): it cannot
  // answer, and its beat may be younger than a silence proves.
  bool stopped = false;
  WorkerProgress progress;
};

// The agent view's content; `taken_ns` is when the views were read (the
// heartbeats' clock), from which the ages are computed.
nlohmann::json agent_view(const Incident& incident, int64_t number, int node, int nproc_per_node,
                          int64_t taken_ns, const std::vector<WorkerView>& workers);

// Copies flight_recorder_rank<rank>_*.json from `run_dir` to `dir` where the
// file's pid is `pid` (an older generation's, or another run's, is not this
// incident's evidence). Returns whether any was copied. Never throws: a
// missing or unreadable dump is missing evidence, not a second failure.
// copy_corruption_reports does the same for sdc_rank<rank>_*.json and
// removes each one it copied: the evidence holds it, and the run directory
// keeps no stale report to be taken for a later incident's.
bool copy_corruption_reports(const std::filesystem::path& run_dir, const std::filesystem::path& dir,
                             int rank, int64_t pid);
bool copy_exit_dumps(const std::filesystem::path& run_dir, const std::filesystem::path& dir,
                     int rank, int64_t pid);

// N for a directory RUN_DIR/incidents/<N>/ the agent named, nullopt for any
// other name (more digits than an int64 holds are not one of ours).
std::optional<int64_t> incident_number(const std::string& name);

// The highest incident number an earlier launch used: of RUN_DIR/incidents/
// <N>/, and of incidents.jsonl's records (a rejoin, or an incident whose
// evidence could not be kept, takes a number but has no directory; counting
// directories alone gave the next launch that number again). 0 when there
// is none. Never throws.
int64_t last_incident_number(const std::filesystem::path& run_dir);

// At a failure, before the generation is killed: creates incident `number`'s
// directory (the caller's, the same on every node: several nodes' agents
// detecting one failure share the directory, each writing its own view;
// probing for a free number would give each node a different one), asks
// the live workers for their dumps and waits for them (bounded, see above),
// copies the exited workers' dumps, and writes agent_view_file(node) with
// the workers as at the call (`exits`: the wait
// status of those already reaped, by rank). Sets incident.evidence_ms.
// Returns the directory, or empty (said on stderr) if it could not be
// written: missing evidence must not stop the recovery. `keep_alive` is
// called every kEvidenceKeepAliveMs while it waits: the agent's beat to the
// coordinator, which must not fall silent for the wait (at load, the wait
// and the root cause after it took a node past the 2 s agent timeout, and
// the leader declared a healthy node lost).
std::filesystem::path keep_evidence(const WorkerGroup& group, const HeartbeatTable& table,
                                    const std::map<int, int>& exits,
                                    const std::filesystem::path& run_dir, int node,
                                    int nproc_per_node, int64_t number, Incident& incident,
                                    const std::function<void()>& keep_alive = {});
inline constexpr int64_t kEvidenceKeepAliveMs = 100;

}  // namespace brigade::elastic

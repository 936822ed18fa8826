// RUN_DIR/incidents/<N>/trace.json: an incident's last moments on one
// timeline, in the Chrome trace format of diag/trace.h (Perfetto,
// chrome://tracing). The launcher writes it once the incident is resolved
// (elastic/agent.h's `resolved` hook: off the restart's path, and after
// every node's evidence is in); `brigade diagnose` writes it for an
// incident that has none.
//
// A fault ends a `--trace` window before it is written (the ranks die or are
// killed), so the run's trace.json never shows the fault; what does survive
// is the incident's evidence (elastic/incident_evidence.h): every live
// rank's flight recorder and each node agent's view. The timeline is built
// from those:
//   - a process per rank ("rank R (node N)", process R + 1 as in trace.json),
//     a lane per communication group ("comm world", "comm dp0"): each
//     collective from when its communicator ran it to its completion (a group
//     runs one at a time, so one queued behind another starts where that one
//     ended; when it was called is in its args), sends and receives as async
//     spans (they overlap); one never completed runs to the dump and is named
//     "... (never completed)": the wall of waiting ranks, drawn, and the
//     root cause's collective carries the cause in its args;
//   - a rank without a dump (it crashed, or was stopped and could not
//     answer) shows one instant saying so, and a dump without times says how
//     many operations it could not place;
//   - the "incident N" process: each node agent's fault and detection, and
//     the root cause's line on the culprit's own process at the detection.
// Times: dumps say "ms before the dump" and when the dump was taken on the
// wall clock (microseconds); the agents' views carry the fault and the
// detection on it too. So ranks on several machines line up to their clocks'
// synchronisation (NTP: typically well under a millisecond); zero is the
// earliest event. Evidence written before these stamps existed (a dump with
// milliseconds only, a view without wall-clock times) gives a coarser or
// shorter timeline, never an error.
#pragma once

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "brigade/diag/root_cause.h"

namespace brigade::diag {

// The timeline of the incident whose evidence is in `dir`, with `cause` (what
// find_root_cause said of read_incident(dir)). Throws Error naming a
// malformed file.
nlohmann::json incident_trace(const std::filesystem::path& dir, const IncidentEvidence& evidence,
                              const RootCause& cause);

// Reads the evidence in `dir`, names the cause and writes dir/trace.json.
// Throws Error saying why none was written.
void write_incident_trace(const std::filesystem::path& dir);

// The launcher's writer: each timeline on a thread of its own (parsing a few
// thousand records per rank takes a good fraction of a second, which the
// agent's loop must not wait for), a failure said in one line on stderr.
// Destruction waits for the writes in flight.
class IncidentTimelines {
 public:
  IncidentTimelines() = default;
  IncidentTimelines(const IncidentTimelines&) = delete;
  IncidentTimelines& operator=(const IncidentTimelines&) = delete;
  ~IncidentTimelines();

  void write(const std::filesystem::path& dir);

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

}  // namespace brigade::diag

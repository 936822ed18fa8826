// RUN_DIR/incidents/<N>/trace.json: an incident's last moments on one
// timeline, in the Chrome trace format of diag/trace.h (Perfetto,
// chrome://tracing), written beside cause.txt wherever an incident is
// diagnosed (the agent at the incident, `brigade diagnose` afterwards).
//
// A fault ends a `--trace` window before it is written (the ranks die or are
// killed), so the run's trace.json never shows the fault; what does survive
// is the incident's evidence (elastic/incident_evidence.h): every live
// rank's flight recorder and each agent's view. The timeline is built from
// those:
//   - a process per rank ("rank R (node N)", process R + 1 as in trace.json),
//     a lane per communication group ("comm world", "comm dp0"): each
//     collective and send/recv the recorder still held, from its call to
//     its completion; one never completed runs to the dump and is named
//     "... (never completed)": the wall of waiting ranks, drawn;
//   - a rank without a dump (it crashed, or was stopped and could not
//     answer) shows one instant saying so;
//   - the "incident N" process: the fault and its detection as instants,
//     and the root cause's line (diag/root_cause.h) on the culprit's own
//     process at the detection.
// Times: dumps say "ms before the dump" and when the dump was taken on the
// wall clock (microseconds), the agent's view the fault and the detection on
// it too; so ranks on several machines line up to their clocks'
// synchronisation (NTP: typically well under a millisecond), and zero is the
// earliest event. Evidence written before these stamps existed (a dump with
// milliseconds only, a view without wall-clock times) gives a coarser or
// shorter timeline, never an error.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "brigade/diag/root_cause.h"

namespace brigade::diag {

// The timeline of the incident whose evidence is in `dir`, with `cause` (what
// find_root_cause said of read_incident(dir)). Throws Error naming a
// malformed file.
nlohmann::json incident_trace(const std::filesystem::path& dir, const IncidentEvidence& evidence,
                              const RootCause& cause);

}  // namespace brigade::diag

// The run's incidents and straggler episodes in its trace: RUN_DIR/trace.json
// and a restarted generation's trace.gen<G>.json (diag/trace.h) are written
// by the workers, which die with a fault and never see it; so the launcher,
// once the run ended (node 0's, whose agent wrote incidents.jsonl), marks in
// each trace what incidents.jsonl says happened during it:
//   - an "incidents" process (after the ranks' processes) with one
//     "incidents" track: per incident an instant at its detection and a span
//     "restart after incident N" from the detection to the first step after
//     the recovery, with its kind, rank, node, cause line, what the agent saw,
//     the recovery's split and a pointer to its own timeline
//     (incidents/N/trace.json) in the args;
//   - per straggler episode a span on that rank's process, its "straggler"
//     track, from when rank 0 named the rank to when it saw it recover (or the
//     trace's end), with the ratio, section and steps in the args.
// An incident or episode is marked where its span overlaps the trace's; one
// that starts before the trace's zero moves zero back (every time, and the
// origin, shift with it). Marking again replaces the earlier marks.
//
// Clocks: the trace's times are rank 0's monotonic clock; the file says its
// zero on the wall clock (otherData's origin_unix_us, converted when rank 0
// joined it). The agent's stamps are node 0's monotonic clock, converted when
// incidents.jsonl was written, by the same function (steady_to_unix_us), on
// the same machine; a straggler record's stamp is rank 0's wall clock when
// named. The two conversions differ by how far the wall clock was slewed in
// between (NTP: at most 0.5 ms per s, far less in practice), so marks line up
// with the steps to well under a millisecond over a run of minutes.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace brigade::diag {

// Adds to `trace` (a trace.json as diag/trace.h writes it) the marks of the
// records of incidents.jsonl that overlap it, after removing any earlier
// marks. Returns how many incidents and episodes it marked. Throws Error
// when the trace has no origin_unix_us (written before it was recorded).
int mark_incidents(nlohmann::json& trace, const std::vector<nlohmann::json>& records);

// Marks every trace of the run in run_dir (trace.json, trace.gen<G>.json)
// with run_dir/incidents.jsonl, rewriting those where anything changed.
// Best effort: what fails is said in one line each, returned; nothing is
// thrown (a trace is never worth the run's exit status).
std::vector<std::string> mark_run_traces(const std::filesystem::path& run_dir);

}  // namespace brigade::diag

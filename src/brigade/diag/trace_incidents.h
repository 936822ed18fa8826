// The run's incidents and straggler episodes in its trace: RUN_DIR/trace.json
// and a restarted generation's trace.gen<G>.json (diag/trace.h) are written
// by the workers, which die with a fault and never see it; so the launcher
// whose agent writes incidents.jsonl (Agent::writes_run_records), once the
// job ended everywhere, marks in each trace of its launch of the job what
// incidents.jsonl says happened during it:
//   - an "incidents" process (after the ranks' processes) with one
//     "incidents" track: per incident an instant at its detection and a span
//     "restart after incident N" from the detection to the first step after
//     the recovery, with its kind, rank, node, cause line, what the agent saw,
//     the recovery's split and a pointer to its own timeline
//     (incidents/N/trace.json) in the args; a rejoin (the job grew back: no
//     failure, no timeline) is "node N rejoined" and its regrowth, no pointer;
//   - per straggler episode a span on that rank's process, its "straggler"
//     track, from when rank 0 named the rank to when it saw it recover, or
//     else to what ended the episode unseen: the next incident (the workers
//     were stopped), the rank named again, or its launch's end (the
//     summary's stamp), whichever came first.
// A trace's window is its own events' span, except that a restarted
// generation's trace begins with the restart it recovered from: an incident
// whose restart ends within the window moves zero back to its detection
// (every time, and the origin, shift with it). Every span is cut to the
// window: nothing is drawn outside it, and nothing else moves zero. Marking
// again replaces the earlier marks.
//
// Clocks: everything is placed on the wall clock (unix microseconds). The
// trace's times are rank 0's monotonic clock, its zero converted to the wall
// clock on rank 0's machine when joined (otherData's origin_unix_us); the
// agent's stamps are its own machine's monotonic clock (another node's
// detection placed on it), converted there when incidents.jsonl was written;
// a straggler record's stamp is rank 0's wall clock when named. Each carries
// the boot id of its machine, and the trace says which case its marks are in
// (otherData's marks_clock): all on rank 0's machine, the conversions differ
// by how far the wall clock was slewed in between (NTP: at most 0.5 ms per
// s, far less in practice), well under a millisecond over a run of minutes;
// from another machine (the leader elected in node 0's place), by the two
// machines' clock synchronisation too (NTP on a LAN: about a millisecond).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace brigade::diag {

// Adds to `trace` (a trace.json as diag/trace.h writes it) the marks of the
// records of incidents.jsonl that overlap it, after removing any earlier
// marks. Returns how many incidents and episodes it marked. Throws Error
// when the trace has no origin_unix_us (written before it was recorded).
int mark_incidents(nlohmann::json& trace, const std::vector<nlohmann::json>& records);

// Marking streams a trace twice (validated and read, then rewritten) through
// nlohmann's parse with a callback that is handed each event as it is
// completed and drops it: one event in memory at a time, so its memory does
// not grow with the trace (a 24 MiB trace: 2.4 MiB at the peak, where its
// parse tree took 330 MiB), its time does (each event parsed twice and
// dumped once: about kMarkedBytesPerSecond on a loaded core). A trace larger than this is not
// marked, so that a launcher's end waits seconds, not minutes.
inline constexpr uintmax_t kMaxMarkedTraceBytes = uintmax_t{128} << 20;
inline constexpr double kMarkedBytesPerSecond = 10e6;

// The traces one launch's workers wrote.
struct LaunchTraces {
  // trace.json and trace.gen1..gen<last_generation>.json.
  int64_t last_generation = 0;
  // When the launch started (unix us): a trace of those names written well
  // before it (its file's time over a minute earlier: the file system's
  // clock may be another machine's, rank 0's node or an NFS server, and
  // keep seconds), or whose zero is earlier (its otherData, read before any
  // event), is an earlier launch's (the run resumed into the directory),
  // marked by that launch and left alone unread.
  int64_t launched_unix_us = 0;
  uintmax_t max_bytes = kMaxMarkedTraceBytes;
  // A launcher stopped by a signal marks what it can until this says time
  // is up (its deadline; asked before each trace and every few thousand
  // events, so that a test can stop it at a chosen point); the rest is left
  // as it was and said in one line. None: no limit.
  std::function<bool()> out_of_time = nullptr;
};

// Marks the launch's traces in run_dir with run_dir/incidents.jsonl,
// rewriting (atomically) those where anything changed. Best effort: what
// fails is said in one line each, returned; nothing is thrown (a trace is
// never worth the run's exit status). When incidents.jsonl cannot be read
// no trace is touched (the earlier marks stay). First it removes the
// temporaries of trace rewrites that a launcher killed while marking left
// (up to a trace's size each: it marks with signals unblocked, and only one
// launcher marks a run, so none is alive), and says so if there were any.
std::vector<std::string> mark_launch_traces(const std::filesystem::path& run_dir,
                                            const LaunchTraces& launch);

}  // namespace brigade::diag

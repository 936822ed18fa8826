// Root cause: from one incident's evidence (elastic/incident_evidence.h:
// the agent's view of every worker and the live workers' flight recorders),
// the one rank that started it, of what kind, and where, as one line:
//
//   incident 3: rank 5 (node 0) stopped responding after step 812, before
//   all_reduce #4431 of group world; 3 ranks were waiting for it there
//
// A fault leaves a wall of symptoms (every peer of a dead rank times out or
// fails in the same collective); the culprit is what the symptoms have in
// common. In order of precedence, since a stronger sign explains the weaker:
//   - silent data corruption: the replicas of a data-parallel group compared
//     their parameters and one rank's differ (its report, sdc_rank<R>_*.json,
//     train/silent_corruption.h); the ranks then exit on purpose, so this
//     comes before what their exits look like. The odd one out by majority
//     is named, or with two replicas (no majority) both;
//   - crash: a worker that died of a signal of its own (the evidence is taken
//     before the agent kills anyone);
//   - hang: a live worker whose heartbeat went silent (stopped, frozen): it
//     "stopped responding";
//   - mismatch or skip: the ranks of a group disagree at one sequence number
//     (comm/flight_recorder.h numbers a group's collectives alike on every
//     rank). The odd rank out skipped a collective when what it ran there is
//     what the group runs right after that collective (its history shows the
//     pair), and called it with another shape (count, dtype, reduction)
//     otherwise: a mismatch;
//   - crash: a worker that exited non-zero, the agent's first if several (a
//     peer of a dead rank may exit on its own communication error);
//   - a live rank behind the collective its group waits in: it skipped that
//     collective if it has moved on (it waits in another one, or is a step
//     ahead), else it is stuck ("stopped making progress").
// A rank that is merely slow is never blamed while another sign explains the
// incident: slowness shows only as being behind, the weakest sign.
//
// Pure functions over plain structs (find_root_cause), so every kind is
// tested on hand-built evidence; read_incident loads the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace brigade::diag {

// One collective of a flight recorder dump.
struct CollectiveRecord {
  uint64_t seq = 0;
  std::string op;     // "shm all_reduce(count 1, f64, max)"
  std::string state;  // scheduled, started, completed, failed
};

struct GroupDump {
  std::string name;
  std::vector<int> members;                   // world ranks, by group rank
  std::vector<CollectiveRecord> collectives;  // oldest first
};

struct RankEvidence {
  int rank = 0;
  // The node's place in the failing generation (rank / nproc_per_node, its
  // GROUP_RANK): after a job went on with fewer nodes (`--nnodes MIN:MAX`)
  // not the original rank incidents.jsonl and the straggler records name.
  int node = 0;
  bool running = true;
  std::optional<int> exit_code;  // how an ended worker ended
  std::optional<int> signal;
  std::optional<double> beat_age_ms;  // at the incident; none: never beat
  bool stopped = false;               // held stopped by a signal (state T)
  int64_t step = 0;                   // steps completed
  std::vector<GroupDump> groups;      // empty: no flight recorder
};

// A worker's report of a failed replica check.
struct CorruptionReport {
  int reporter = 0;  // world rank
  int64_t step = 0;
  std::string group;
  std::string compared;             // what was hashed
  std::vector<int> members;         // world ranks, by group rank
  std::vector<std::string> hashes;  // by group rank
  std::vector<int> suspects;        // world ranks
  // The check's own words, for the checks that are not a comparison of
  // replicas (ZeRO 3's slices against themselves, the gradient replay).
  std::string finding;
};

struct IncidentEvidence {
  int64_t number = 0;
  std::string detected_what;  // the agent's own words, for when nothing is found
  int detected_rank = -1;     // the agent's first failure
  std::vector<RankEvidence> ranks;
  std::vector<CorruptionReport> corruption;
};

struct RootCause {
  // crash, hang, mismatch, skip, sdc; "unknown" when the evidence names nobody.
  std::string kind = "unknown";
  int rank = -1;
  std::vector<int> suspects;  // sdc: every rank named (rank is the first)
  int node = 0;
  int64_t step = 0;
  // The collective: where the others wait, or the one skipped or mismatched.
  std::string group;
  std::optional<uint64_t> seq;
  std::string op;
  int waiting = 0;   // ranks waiting for the culprit in that collective
  std::string line;  // "incident 3: rank 5 (node 0) ..."
};

// A heartbeat older than this means the process is not running at all (it
// beats every 100 ms from its own thread, whatever training does). A rank
// the kernel holds stopped is not running whatever its beat's age: the
// agent sees that state within a few beats (elastic/watchdog.h).
inline constexpr double kSilentBeatMs = 1'000;

RootCause find_root_cause(const IncidentEvidence& evidence);

// Reads RUN_DIR/incidents/<N>/: every node's agent view (agent_node<k>.json,
// or agent.json of older runs) and every dump. Throws Error naming the
// directory when no view is there, or the file when one is malformed.
IncidentEvidence read_incident(const std::filesystem::path& dir);

// One evidence file as JSON. Throws Error naming it when it cannot be read
// or is not JSON.
nlohmann::json read_evidence_json(const std::filesystem::path& path);

// The incident directories of a run, by number. Throws Error saying what is
// missing (and how evidence comes to be) when there are none.
std::vector<std::filesystem::path> incident_dirs(const std::filesystem::path& run_dir);

// read_incident, find_root_cause and a copy of the result in the directory
// (cause.txt, the line): what the launcher's agent runs at an incident.
std::string diagnose_incident(const std::filesystem::path& dir);

}  // namespace brigade::diag

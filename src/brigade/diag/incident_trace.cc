#include "brigade/diag/incident_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade::diag {
namespace fs = std::filesystem;
namespace {

std::optional<double> number_or_null(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number()) return std::nullopt;
  return j.at(key).get<double>();
}

// Builds the events on absolute wall-clock microseconds; shifted to start
// at zero at the end.
class Timeline {
 public:
  static int pid_of_rank(int rank) { return rank + 1; }

  int tid_of(int pid, const std::string& lane) {
    auto& lanes = lanes_[pid];
    const auto it = lanes.find(lane);
    if (it != lanes.end()) return it->second;
    const int tid = static_cast<int>(lanes.size()) + 1;
    lanes.emplace(lane, tid);
    metadata_.push_back({{"name", "thread_name"},
                         {"ph", "M"},
                         {"pid", pid},
                         {"tid", tid},
                         {"args", {{"name", lane}}}});
    return tid;
  }

  void name_process(int pid, const std::string& name) {
    metadata_.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    metadata_.push_back({{"name", "process_sort_index"},
                         {"ph", "M"},
                         {"pid", pid},
                         {"args", {{"sort_index", pid}}}});
  }

  void add(nlohmann::json event) { events_.push_back(std::move(event)); }

  void instant(int pid, int tid, std::string name, double at_us) {
    add({{"name", std::move(name)},
         {"ph", "i"},
         {"s", "p"},
         {"pid", pid},
         {"tid", tid},
         {"ts", at_us}});
  }

  double latest_us() const {
    double latest = 0;
    for (const nlohmann::json& e : events_) {
      latest = std::max(latest, e.at("ts").get<double>() + e.value("dur", 0.0));
    }
    return latest;
  }

  nlohmann::json finish(nlohmann::json other) {
    double first = 0;
    for (size_t i = 0; i < events_.size(); ++i) {
      const double ts = events_[i].at("ts").get<double>();
      first = i == 0 ? ts : std::min(first, ts);
    }
    nlohmann::json all = std::move(metadata_);
    for (nlohmann::json& e : events_) {
      e["ts"] = e.at("ts").get<double>() - first;
      if (e.contains("args") && e.at("args").contains("called_us")) {
        e["args"]["called_us"] = e.at("args").at("called_us").get<double>() - first;
      }
      all.push_back(std::move(e));
    }
    other["origin_unix_us"] = first;
    return {{"traceEvents", std::move(all)},
            {"displayTimeUnit", "ms"},
            {"otherData", std::move(other)}};
  }

 private:
  std::map<int, std::map<std::string, int>> lanes_;
  nlohmann::json metadata_ = nlohmann::json::array();
  std::vector<nlohmann::json> events_;
};

// One dump's records on its rank's lane for its group (as diag/trace.cc
// draws a window's). Returns the records it could not place (no times).
int64_t add_dump(Timeline& t, const nlohmann::json& dump, const RootCause& cause) {
  const int rank = dump.at("world_rank").get<int>();
  const std::string group = dump.at("group").at("name").get<std::string>();
  const nlohmann::json& records = dump.at("records");
  // Dumps before the microsecond stamp carry milliseconds only; one without
  // either cannot be placed.
  std::optional<double> dumped_us = number_or_null(dump, "dumped_at_unix_us");
  if (!dumped_us) {
    if (const auto ms = number_or_null(dump, "dumped_at_unix_ms")) dumped_us = *ms * 1e3;
  }
  if (!dumped_us) return static_cast<int64_t>(records.size());
  const int pid = Timeline::pid_of_rank(rank);
  const int tid = t.tid_of(pid, "comm " + group);
  const auto at = [&](const nlohmann::json& r, const char* key) -> std::optional<double> {
    const auto ago_ms = number_or_null(r, key);
    if (!ago_ms) return std::nullopt;
    return *dumped_us - *ago_ms * 1e3;
  };
  int64_t unplaced = 0;
  double lane_free_us = 0;  // where the group's previous collective ended
  for (const nlohmann::json& r : records) {
    const auto called = at(r, "scheduled_ms_ago");
    if (!called) {
      ++unplaced;
      continue;
    }
    const std::string state = r.value("state", std::string("unknown"));
    const std::string kind = r.value("kind", std::string("collective"));
    const uint64_t seq = r.value("seq", uint64_t{0});
    const std::string op = r.value("op", std::string("?"));
    const auto finished = at(r, "finished_ms_ago");
    std::string name = fmt::format("{} #{}", op, seq);
    if (state == "failed") {
      name += " (failed)";
    } else if (!finished) {
      name += state == "scheduled" ? " (never started)" : " (never completed)";
    }
    const std::string key = fmt::format("{}/{}/{}", group, kind, seq);
    nlohmann::json args = {{"group", group}, {"kind", kind},   {"seq", seq},
                           {"key", key},     {"state", state}, {"called_us", *called}};
    if (r.contains("bytes")) args["bytes"] = r.at("bytes");
    if (r.contains("error")) args["error"] = r.at("error");
    if (kind == "collective") {
      if (group == cause.group && cause.seq && *cause.seq == seq) args["root_cause"] = cause.line;
      const double begin = std::max(at(r, "started_ms_ago").value_or(*called), lane_free_us);
      const double end = std::max(begin, finished.value_or(*dumped_us));
      lane_free_us = end;
      t.add({{"name", std::move(name)},
             {"cat", "comm"},
             {"ph", "X"},
             {"pid", pid},
             {"tid", tid},
             {"ts", begin},
             {"dur", end - begin},
             {"args", std::move(args)}});
      continue;
    }
    // Sends and receives overlap each other: async spans on their own rows.
    const double end = std::max(*called, finished.value_or(*dumped_us));
    t.add({{"name", name},
           {"cat", "p2p"},
           {"ph", "b"},
           {"pid", pid},
           {"tid", tid},
           {"ts", *called},
           {"id2", {{"local", key}}},
           {"args", std::move(args)}});
    t.add({{"name", std::move(name)},
           {"cat", "p2p"},
           {"ph", "e"},
           {"pid", pid},
           {"tid", tid},
           {"ts", end},
           {"id2", {{"local", key}}}});
  }
  return unplaced;
}

std::string how_it_ended(const RankEvidence& r) {
  if (r.signal) return fmt::format("it was ended by signal {}", *r.signal);
  if (r.exit_code) return fmt::format("it exited with status {}", *r.exit_code);
  if (r.running) return "it did not answer (stopped or frozen)";
  return "it had ended";
}

}  // namespace

nlohmann::json incident_trace(const fs::path& dir, const IncidentEvidence& evidence,
                              const RootCause& cause) {
  Timeline t;
  std::map<int, int> node_of;
  int top_rank = 0;
  for (const RankEvidence& r : evidence.ranks) {
    node_of[r.rank] = r.node;
    top_rank = std::max(top_rank, r.rank);
  }
  for (const auto& [rank, node] : node_of) {
    t.name_process(Timeline::pid_of_rank(rank), fmt::format("rank {} (node {})", rank, node));
  }
  std::vector<fs::path> dumps, views;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".json")) continue;
    if (name.starts_with("flight_recorder_rank")) dumps.push_back(entry.path());
    if (name.starts_with("agent_node") || name == "agent.json") views.push_back(entry.path());
  }
  std::sort(dumps.begin(), dumps.end());
  std::sort(views.begin(), views.end());
  std::map<int, int64_t> unplaced;  // by rank
  std::map<int, bool> dumped;
  for (const fs::path& path : dumps) {
    const nlohmann::json dump = read_evidence_json(path);
    try {
      const int rank = dump.at("world_rank").get<int>();
      unplaced[rank] += add_dump(t, dump, cause);
      dumped[rank] = true;
    } catch (const nlohmann::json::exception& e) {
      throw_error("{} is not a flight recorder dump ({}): the evidence is damaged", path.string(),
                  e.what());
    }
  }
  // Each node's agent: its fault and its detection, in its own words.
  const int incident_pid = top_rank + 2;
  t.name_process(incident_pid, fmt::format("incident {}", evidence.number));
  std::optional<double> detected_us;
  for (const fs::path& path : views) {
    const nlohmann::json view = read_evidence_json(path);
    const int node = view.value("node", 0);
    const int tid = t.tid_of(incident_pid, fmt::format("agent node {}", node));
    const nlohmann::json none = nlohmann::json::object();
    const nlohmann::json& detected = view.contains("detected") ? view.at("detected") : none;
    const std::string what = detected.value("what", std::string("a failure"));
    if (const auto fault = number_or_null(view, "fault_unix_us")) {
      t.instant(incident_pid, tid, fmt::format("fault (node {}): {}", node, what), *fault);
    }
    if (const auto at = number_or_null(view, "detected_unix_us")) {
      t.instant(incident_pid, tid, fmt::format("detected (node {})", node), *at);
      detected_us = detected_us ? std::min(*detected_us, *at) : *at;
    }
  }
  // Without the agents' stamps (older evidence) the dumps' end stands in.
  const double detection = detected_us.value_or(t.latest_us());
  if (!detected_us) {
    t.instant(incident_pid, t.tid_of(incident_pid, "agent"),
              "detected (time unknown: the dumps' end)", detection);
  }
  int64_t unplaced_total = 0;
  for (const RankEvidence& r : evidence.ranks) {
    const int pid = Timeline::pid_of_rank(r.rank);
    if (!dumped.contains(r.rank)) {
      t.instant(pid, t.tid_of(pid, "evidence"), "no flight recorder: " + how_it_ended(r),
                detection);
    } else if (unplaced[r.rank] > 0) {
      unplaced_total += unplaced[r.rank];
      t.instant(pid, t.tid_of(pid, "evidence"),
                fmt::format("dump without times: {} operations not placed", unplaced[r.rank]),
                detection);
    }
  }
  if (cause.rank >= 0 && node_of.contains(cause.rank)) {
    const int pid = Timeline::pid_of_rank(cause.rank);
    t.instant(pid, t.tid_of(pid, "evidence"), cause.line, detection);
  } else {
    t.instant(incident_pid, t.tid_of(incident_pid, "agent"), cause.line, detection);
  }
  return t.finish({{"incident", evidence.number},
                   {"cause", cause.line},
                   {"kind", cause.kind},
                   {"unplaced_operations", unplaced_total},
                   {"clock",
                    "wall clock: the dumps' and the agents' stamps (ranks on several machines "
                    "line up to their clocks' synchronisation)"}});
}

void write_incident_trace(const fs::path& dir) {
  const IncidentEvidence evidence = read_incident(dir);
  const RootCause cause = find_root_cause(evidence);
  write_file_atomic(dir / "trace.json", incident_trace(dir, evidence, cause).dump() + "\n");
}

void IncidentTimelines::write(const fs::path& dir) {
  std::lock_guard<std::mutex> lock(mutex_);
  threads_.emplace_back([dir] {
    try {
      write_incident_trace(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "brigade launch: no timeline for %s: %s\n", dir.c_str(), e.what());
      std::fflush(stderr);
    }
  });
}

IncidentTimelines::~IncidentTimelines() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::thread& t : threads_) t.join();
}

}  // namespace brigade::diag

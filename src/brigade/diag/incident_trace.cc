#include "brigade/diag/incident_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "brigade/core/error.h"

namespace brigade::diag {
namespace fs = std::filesystem;
namespace {

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw_error("cannot read {}", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is not valid JSON ({}): the evidence is damaged", path.string(), e.what());
  }
}

std::optional<double> number_or_null(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number()) return std::nullopt;
  return j.at(key).get<double>();
}

// Builds the events on absolute wall-clock microseconds; shifted to start
// at zero at the end.
class Timeline {
 public:
  int pid_of_rank(int rank) const { return rank + 1; }

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

  void span(int pid, int tid, std::string name, double begin_us, double end_us,
            nlohmann::json args) {
    events_.push_back({{"name", std::move(name)},
                       {"ph", "X"},
                       {"pid", pid},
                       {"tid", tid},
                       {"ts", begin_us},
                       {"dur", std::max(0.0, end_us - begin_us)},
                       {"args", std::move(args)}});
  }

  void instant(int pid, int tid, std::string name, double at_us, const char* scope = "p") {
    events_.push_back({{"name", std::move(name)},
                       {"ph", "i"},
                       {"s", scope},
                       {"pid", pid},
                       {"tid", tid},
                       {"ts", at_us}});
  }

  bool empty() const { return events_.empty(); }
  double latest_us() const {
    double latest = 0;
    for (const nlohmann::json& e : events_) {
      latest = std::max(latest, e.at("ts").get<double>() + e.value("dur", 0.0));
    }
    return latest;
  }

  nlohmann::json finish(nlohmann::json other) {
    double first = 0;
    bool any = false;
    for (const nlohmann::json& e : events_) {
      const double ts = e.at("ts").get<double>();
      first = any ? std::min(first, ts) : ts;
      any = true;
    }
    nlohmann::json all = std::move(metadata_);
    for (nlohmann::json& e : events_) {
      e["ts"] = e.at("ts").get<double>() - first;
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

// One dump's records as spans on its rank's lane for its group. Returns when
// the dump was taken.
double add_dump(Timeline& t, const nlohmann::json& dump, const RootCause& cause,
                const fs::path& path) {
  try {
    const int rank = dump.at("world_rank").get<int>();
    const std::string group = dump.at("group").at("name").get<std::string>();
    // Dumps before the microsecond stamp carry milliseconds only; one
    // without either cannot be placed.
    double dumped_us = 0;
    if (const auto us = number_or_null(dump, "dumped_at_unix_us")) {
      dumped_us = *us;
    } else if (const auto ms = number_or_null(dump, "dumped_at_unix_ms")) {
      dumped_us = *ms * 1e3;
    } else {
      return 0;
    }
    const int pid = t.pid_of_rank(rank);
    const int tid = t.tid_of(pid, "comm " + group);
    const auto at = [&](const nlohmann::json& r, const char* key) -> std::optional<double> {
      const auto ago_ms = number_or_null(r, key);
      if (!ago_ms) return std::nullopt;
      return dumped_us - *ago_ms * 1e3;
    };
    for (const nlohmann::json& r : dump.at("records")) {
      const auto scheduled = at(r, "scheduled_ms_ago");
      if (!scheduled) continue;  // no time: nothing to place
      const std::string state = r.at("state").get<std::string>();
      const std::string kind = r.at("kind").get<std::string>();
      const uint64_t seq = r.at("seq").get<uint64_t>();
      const double begin = at(r, "started_ms_ago").value_or(*scheduled);
      const auto finished = at(r, "finished_ms_ago");
      std::string name = fmt::format("{} #{}", r.at("op").get<std::string>(), seq);
      if (state == "failed") {
        name += " (failed)";
      } else if (!finished) {
        name += state == "scheduled" ? " (never started)" : " (never completed)";
      }
      nlohmann::json args = {{"group", group},
                             {"kind", kind},
                             {"seq", seq},
                             {"state", state},
                             {"bytes", r.value("bytes", int64_t{0})},
                             {"called_us", *scheduled}};
      if (r.contains("error")) args["error"] = r.at("error");
      if (kind == "collective" && group == cause.group && cause.seq && *cause.seq == seq) {
        args["root_cause"] = cause.line;
      }
      t.span(pid, tid, std::move(name), begin, finished.value_or(dumped_us), std::move(args));
    }
    return dumped_us;
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is not a flight recorder dump ({}): the evidence is damaged", path.string(),
                e.what());
  }
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
    t.name_process(t.pid_of_rank(rank), fmt::format("rank {} (node {})", rank, node));
  }
  std::vector<fs::path> dumps, views;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".json")) continue;
    if (name.starts_with("flight_recorder_rank")) dumps.push_back(entry.path());
    if (name.starts_with("agent_node") || name == "agent.json") views.push_back(entry.path());
  }
  std::sort(dumps.begin(), dumps.end());
  std::map<int, bool> dumped;
  double last_dump_us = 0;
  for (const fs::path& path : dumps) {
    const nlohmann::json dump = read_json_file(path);
    last_dump_us = std::max(last_dump_us, add_dump(t, dump, cause, path));
    dumped[dump.value("world_rank", -1)] = true;
  }
  // The fault and its detection, from the agents' views (the earliest of
  // each: every node's agent writes one).
  std::optional<double> fault_us, detected_us;
  for (const fs::path& path : views) {
    const nlohmann::json view = read_json_file(path);
    for (auto [key, slot] :
         {std::pair{"fault_unix_us", &fault_us}, std::pair{"detected_unix_us", &detected_us}}) {
      if (const auto v = number_or_null(view, key))
        *slot = slot->has_value() ? std::min(**slot, *v) : *v;
    }
  }
  // Without the agents' stamps (older evidence) the dumps' end stands in.
  const double detection = detected_us.value_or(t.empty() ? 0.0 : t.latest_us());
  const int incident_pid = top_rank + 2;
  t.name_process(incident_pid, fmt::format("incident {}", evidence.number));
  const int incident_tid = t.tid_of(incident_pid, "agent");
  if (fault_us) {
    t.instant(incident_pid, incident_tid, "fault: " + evidence.detected_what, *fault_us, "g");
  }
  t.instant(incident_pid, incident_tid,
            detected_us ? "detected" : "detected (time unknown: the dumps' end)", detection, "g");
  for (const RankEvidence& r : evidence.ranks) {
    if (dumped.contains(r.rank)) continue;
    const int pid = t.pid_of_rank(r.rank);
    t.instant(pid, t.tid_of(pid, "evidence"), "no flight recorder: " + how_it_ended(r), detection);
  }
  if (cause.rank >= 0 && node_of.contains(cause.rank)) {
    const int pid = t.pid_of_rank(cause.rank);
    t.instant(pid, t.tid_of(pid, "evidence"), cause.line, detection);
  } else {
    t.instant(incident_pid, incident_tid, cause.line, detection);
  }
  nlohmann::json other = {{"incident", evidence.number},
                          {"cause", cause.line},
                          {"kind", cause.kind},
                          {"clock",
                           "wall clock: the dumps' and the agents' stamps (ranks on several "
                           "machines line up to their clocks' synchronisation)"}};
  if (last_dump_us > 0) other["last_dump_unix_us"] = last_dump_us;
  return t.finish(std::move(other));
}

}  // namespace brigade::diag

#include "brigade/diag/trace_incidents.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <regex>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/diag/trace.h"

namespace brigade::diag {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kIncidentCategory[] = "incident";
constexpr char kStragglerCategory[] = "straggler";
// The incidents process's one track, and each rank's straggler track: below
// trace.cc's group lanes (from 2^30), above any Linux thread id (2^22).
constexpr int64_t kIncidentLane = 1;
constexpr int64_t kStragglerLane = (int64_t{1} << 30) - 1;

bool is_mark(const json& e) {
  const std::string category = e.value("cat", "");
  return category == kIncidentCategory || category == kStragglerCategory;
}

std::optional<int64_t> stamp(const json& record, const char* key) {
  if (!record.contains(key) || !record.at(key).is_number()) return std::nullopt;
  return record.at(key).get<int64_t>();
}

json value_or_null(const json& record, const char* key) {
  return record.contains(key) ? record.at(key) : json(nullptr);
}

// One incident's or episode's events, in wall-clock microseconds ("ts" and
// "dur" made relative to the trace's zero below).
struct Mark {
  int64_t begin_us = 0;
  int64_t end_us = 0;
  std::vector<json> events;
};

std::optional<Mark> incident_mark(const json& r, int pid) {
  const auto detected = stamp(r, "detected_unix_us");
  if (!detected) return std::nullopt;  // a record written before the stamps were
  const auto fault = stamp(r, "fault_unix_us");
  const auto recovered = stamp(r, "recovered_unix_us");
  const std::string kind = r.value("kind", "incident");
  const int rank = r.value("rank", -1);
  json args = {{"kind", kind},
               {"rank", rank},
               {"node", value_or_null(r, "node")},
               {"generation", value_or_null(r, "generation")},
               {"cause", value_or_null(r, "cause")},
               {"what", value_or_null(r, "what")},
               {"last_step", value_or_null(r, "last_step")},
               {"resumed_from_step", value_or_null(r, "resumed_from_step")},
               {"detected_after_ms", value_or_null(r, "detected_after_ms")},
               {"recovered_after_ms", value_or_null(r, "recovered_after_ms")},
               {"recovery_ms", value_or_null(r, "recovery_ms")}};
  std::string title = rank >= 0 ? fmt::format("{} of rank {}", kind, rank) : kind;
  if (const auto number = stamp(r, "number")) {
    args["number"] = *number;
    args["timeline"] = fmt::format("incidents/{}/trace.json", *number);
    title = fmt::format("incident {}: {}", *number, title);
  }
  Mark m;
  m.begin_us = std::min(*detected, fault.value_or(*detected));
  m.end_us = std::max(*detected, recovered.value_or(*detected));
  // Detected, on the incidents track: where the gap in the ranks' lanes
  // starts.
  m.events.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", title + " detected"},
                      {"cat", kIncidentCategory},
                      {"pid", pid},
                      {"tid", kIncidentLane},
                      {"ts", *detected},
                      {"args", args}});
  if (recovered && *recovered > *detected) {
    m.events.push_back({{"ph", "X"},
                        {"name", "restart after " + title},
                        {"cat", kIncidentCategory},
                        {"pid", pid},
                        {"tid", kIncidentLane},
                        {"ts", *detected},
                        {"dur", *recovered - *detected},
                        {"args", std::move(args)}});
  }
  return m;
}

Mark straggler_mark(const json& named, const std::optional<json>& recovered, int64_t trace_end_us) {
  const int rank = named.value("rank", 0);
  const int64_t begin = named.at("unix_us").get<int64_t>();
  const int64_t end = recovered ? std::max(begin, recovered->at("unix_us").get<int64_t>())
                                : std::max(begin, trace_end_us);
  json args = {{"rank", rank},
               {"node", value_or_null(named, "node")},
               {"section", value_or_null(named, "section")},
               {"ratio", value_or_null(named, "ratio")},
               {"named_over_steps", fmt::format("{}-{}", named.value("first_step", int64_t{0}),
                                                named.value("last_step", int64_t{0}))},
               {"what", value_or_null(named, "what")},
               {"recovered", recovered ? value_or_null(*recovered, "what") : json(nullptr)}};
  const int pid = rank + 1;  // the rank's own process (diag/trace.h)
  Mark m;
  m.begin_us = begin;
  m.end_us = end;
  m.events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"cat", kStragglerCategory},
                      {"pid", pid},
                      {"tid", kStragglerLane},
                      {"args", {{"name", "straggler"}}}});
  m.events.push_back(
      {{"ph", "X"},
       {"name", fmt::format("straggler: {:.1f}x slower ({})", named.value("ratio", 0.0),
                            named.value("section", std::string("compute")))},
       {"cat", kStragglerCategory},
       {"pid", pid},
       {"tid", kStragglerLane},
       {"ts", begin},
       {"dur", end - begin},
       {"args", std::move(args)}});
  return m;
}

}  // namespace

int mark_incidents(json& trace, const std::vector<json>& records) {
  json& other = trace["otherData"];
  if (!other.is_object() || !other.contains(kOriginKey) || !other.at(kOriginKey).is_number()) {
    throw_error(
        "the trace has no {} (written by an older Brigade): its incidents cannot be placed; the "
        "incidents are in incidents.jsonl and each one's timeline in incidents/N/trace.json",
        kOriginKey);
  }
  int64_t origin_us = other.at(kOriginKey).get<int64_t>();
  json& events = trace.at("traceEvents");
  json kept = json::array();
  double end_ts = 0;
  int last_pid = 0;
  for (json& e : events) {
    if (is_mark(e)) continue;
    if (e.contains("ts")) {
      end_ts = std::max(end_ts, e.at("ts").get<double>() + e.value("dur", 0.0));
    }
    last_pid = std::max(last_pid, e.value("pid", 0));
    kept.push_back(std::move(e));
  }
  events = std::move(kept);
  const int64_t trace_end_us = origin_us + static_cast<int64_t>(end_ts);
  const int incidents_pid = last_pid + 1;
  const auto overlaps = [&](const Mark& m) {
    return m.end_us >= origin_us && m.begin_us <= trace_end_us;
  };

  std::vector<Mark> marks;
  std::map<int, const json*> named;  // an open episode per rank
  const auto close = [&](int rank, const std::optional<json>& recovered) {
    const auto it = named.find(rank);
    if (it == named.end()) return;
    Mark m = straggler_mark(*it->second, recovered, trace_end_us);
    if (overlaps(m)) marks.push_back(std::move(m));
    named.erase(it);
  };
  for (const json& r : records) {
    const std::string kind = r.value("kind", "");
    if (kind == "summary") continue;
    if (kind == "straggler" || kind == "straggler_recovered") {
      if (!stamp(r, "unix_us")) continue;
      const int rank = r.value("rank", 0);
      if (kind == "straggler") {
        close(rank, std::nullopt);  // named again without recovering: a new episode
        named[rank] = &r;
      } else {
        close(rank, r);
      }
      continue;
    }
    if (std::optional<Mark> m = incident_mark(r, incidents_pid); m && overlaps(*m)) {
      marks.push_back(std::move(*m));
    }
  }
  while (!named.empty()) close(named.begin()->first, std::nullopt);
  if (marks.empty()) return 0;

  // A mark before zero moves zero back, as diag/trace.h's join does for a
  // rank that opened its window first: the viewers drop negative times.
  int64_t first_us = origin_us;
  for (const Mark& m : marks) first_us = std::min(first_us, m.begin_us);
  if (first_us < origin_us) {
    const double shift = static_cast<double>(origin_us - first_us);
    for (json& e : events) {
      if (e.contains("ts")) e["ts"] = e.at("ts").get<double>() + shift;
      if (e.contains("args") && e.at("args").is_object() && e.at("args").contains("called_us")) {
        e["args"]["called_us"] = e.at("args").at("called_us").get<double>() + shift;
      }
    }
    origin_us = first_us;
    other[kOriginKey] = origin_us;
  }
  bool any_incident = false;
  for (Mark& m : marks) {
    for (json& e : m.events) {
      if (e.contains("ts")) e["ts"] = static_cast<double>(e.at("ts").get<int64_t>() - origin_us);
      if (e.value("cat", "") == kIncidentCategory) any_incident = true;
      events.push_back(std::move(e));
    }
  }
  if (any_incident) {
    const auto meta = [&](const char* what, int64_t tid, json args) {
      events.push_back({{"ph", "M"},
                        {"name", what},
                        {"cat", kIncidentCategory},
                        {"pid", incidents_pid},
                        {"tid", tid},
                        {"args", std::move(args)}});
    };
    meta("process_name", 0, {{"name", "incidents"}});
    meta("process_sort_index", 0, {{"sort_index", -1}});  // above the ranks
    meta("thread_name", kIncidentLane, {{"name", "incidents"}});
  }
  return static_cast<int>(marks.size());
}

std::vector<std::string> mark_run_traces(const fs::path& run_dir) {
  std::vector<std::string> said;
  const fs::path incidents_path = run_dir / "incidents.jsonl";
  std::error_code ec;
  if (!fs::exists(incidents_path, ec)) return said;
  std::vector<json> records;
  {
    std::ifstream in(incidents_path);
    for (std::string line; std::getline(in, line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_object()) records.push_back(std::move(record));  // a torn line: passed over
    }
  }
  static const std::regex kTraceName(R"(trace(\.gen[0-9]+)?\.json)");
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, kTraceName)) continue;
    try {
      json trace = json::parse(read_file(entry.path()));
      const bool had_marks =
          std::any_of(trace.at("traceEvents").begin(), trace.at("traceEvents").end(), is_mark);
      if (mark_incidents(trace, records) > 0 || had_marks) {
        write_file_atomic(entry.path(), trace.dump() + "\n");
      }
    } catch (const std::exception& e) {
      said.push_back(fmt::format("could not mark the run's incidents in {}: {}",
                                 entry.path().string(), e.what()));
    }
  }
  return said;
}

}  // namespace brigade::diag

#include "brigade/diag/trace_incidents.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "brigade/core/error.h"
#include "brigade/diag/trace.h"
#include "brigade/diag/trace_marks.h"

namespace brigade::diag {
using nlohmann::json;

namespace trace_marks {
namespace {

constexpr char kIncidentCategory[] = "incident";
constexpr char kStragglerCategory[] = "straggler";
constexpr char kMarksClockKey[] = "marks_clock";
// The incidents process's one track, and each rank's straggler track: below
// trace.cc's group lanes (from 2^30), above any Linux thread id (2^22).
constexpr int64_t kIncidentLane = 1;
constexpr int64_t kStragglerLane = (int64_t{1} << 30) - 1;

}  // namespace

bool is_mark(const json& e) {
  const std::string category = e.value("cat", "");
  return category == kIncidentCategory || category == kStragglerCategory;
}

std::optional<int64_t> stamp(const json& record, const char* key) {
  if (!record.contains(key) || !record.at(key).is_number()) return std::nullopt;
  return record.at(key).get<int64_t>();
}

namespace {

json value_or_null(const json& record, const char* key) {
  return record.contains(key) ? record.at(key) : json(nullptr);
}

// A rejoin stopped the job to grow it back: no failure, no evidence.
bool is_failure(const json& r) {
  return r.value("kind", "") != "rejoin" && !(r.contains("restart") && r.at("restart") == false);
}

// One incident's or episode's events, in wall-clock microseconds ("ts" and
// "dur" made relative to the trace's zero, and cut to its window, below).
struct Mark {
  int64_t begin_us = 0;
  int64_t end_us = 0;
  std::vector<json> events;
  std::string boot_id;  // the machine whose clock placed it
};

std::optional<Mark> incident_mark(const json& r, int pid) {
  const auto detected = stamp(r, "detected_unix_us");
  if (!detected) return std::nullopt;  // a record written before the stamps were
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
  // The run's one numbering (elastic/incident_evidence.h): a rejoin takes
  // one too, and has no timeline.
  if (const auto number = stamp(r, "number")) args["number"] = *number;
  std::string detected_name, span_name;
  if (!is_failure(r)) {
    const std::string node = r.contains("node") ? r.at("node").dump() : std::string("?");
    detected_name = fmt::format("node {} rejoined", node);
    span_name = fmt::format("regrowth after node {} rejoined", node);
  } else {
    std::string title = rank >= 0 ? fmt::format("{} of rank {}", kind, rank) : kind;
    if (const auto number = stamp(r, "number")) {
      args["timeline"] = fmt::format("incidents/{}/trace.json", *number);
      title = fmt::format("incident {}: {}", *number, title);
    }
    detected_name = title + " detected";
    span_name = "restart after " + title;
  }
  Mark m;
  m.begin_us = *detected;
  m.end_us = std::max(*detected, recovered.value_or(*detected));
  m.boot_id = r.value("boot_id", "");
  // Detected, on the incidents track: where the gap in the ranks' lanes
  // starts.
  m.events.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", detected_name},
                      {"cat", kIncidentCategory},
                      {"pid", pid},
                      {"tid", kIncidentLane},
                      {"ts", *detected},
                      {"args", args}});
  if (m.end_us > m.begin_us) {
    m.events.push_back({{"ph", "X"},
                        {"name", span_name},
                        {"cat", kIncidentCategory},
                        {"pid", pid},
                        {"tid", kIncidentLane},
                        {"ts", *detected},
                        {"dur", m.end_us - m.begin_us},
                        {"args", std::move(args)}});
  }
  return m;
}

Mark straggler_mark(const json& named, int64_t end_us, const std::string& ended) {
  const int rank = named.value("rank", 0);
  json args = {{"rank", rank},
               {"node", value_or_null(named, "node")},
               {"section", value_or_null(named, "section")},
               {"ratio", value_or_null(named, "ratio")},
               {"named_over_steps", fmt::format("{}-{}", named.value("first_step", int64_t{0}),
                                                named.value("last_step", int64_t{0}))},
               {"what", value_or_null(named, "what")},
               {"ended", ended}};
  const int pid = rank + 1;  // the rank's own process (diag/trace.h)
  Mark m;
  m.begin_us = named.at("unix_us").get<int64_t>();
  m.end_us = std::max(m.begin_us, end_us);
  m.boot_id = named.value("boot_id", "");
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
       {"ts", m.begin_us},
       {"dur", m.end_us - m.begin_us},
       {"args", std::move(args)}});
  return m;
}

// Each straggler episode with its end: the rank's recovery as rank 0 saw
// it, else what ended it unseen (the workers stopped for an incident, the
// rank named again, the launch's end), the first of them; none known (a
// launch cut off before its summary): its end is not known, std::nullopt.
struct Episode {
  const json* named = nullptr;
  std::optional<int64_t> end_us;
  std::string ended;
};

std::vector<Episode> episodes(const std::vector<json>& records) {
  std::vector<int64_t> stops;  // incidents' detections: the workers stopped
  std::vector<int64_t> launch_ends;
  for (const json& r : records) {
    const std::string kind = r.value("kind", "");
    if (kind == "summary") {
      if (const auto at = stamp(r, "unix_us")) launch_ends.push_back(*at);
    } else if (!kind.starts_with("straggler")) {
      if (const auto at = stamp(r, "detected_unix_us")) stops.push_back(*at);
    }
  }
  const auto first_after = [](const std::vector<int64_t>& times, int64_t t) {
    std::optional<int64_t> first;
    for (int64_t x : times) {
      if (x >= t && (!first || x < *first)) first = x;
    }
    return first;
  };
  std::vector<Episode> out;
  std::map<int, size_t> open;  // rank -> its episode in `out`
  for (const json& r : records) {
    const std::string kind = r.value("kind", "");
    if ((kind != "straggler" && kind != "straggler_recovered") || !stamp(r, "unix_us")) continue;
    const int rank = r.value("rank", 0);
    const int64_t at = *stamp(r, "unix_us");
    const auto it = open.find(rank);
    if (kind == "straggler_recovered") {
      if (it == open.end()) continue;
      Episode& e = out[it->second];
      if (!e.end_us || at <= *e.end_us) {
        e.end_us = at;
        e.ended = "recovered";
      }
      open.erase(it);
      continue;
    }
    if (it != open.end()) {  // named again without recovering: a new episode
      Episode& e = out[it->second];
      if (!e.end_us || at < *e.end_us) {
        e.end_us = at;
        e.ended = "named again";
      }
    }
    Episode e{&r, std::nullopt, ""};
    const int64_t named = at;
    if (const auto stop = first_after(stops, named)) {
      e.end_us = *stop;
      e.ended = "the workers stopped for an incident";
    }
    if (const auto end = first_after(launch_ends, named); end && (!e.end_us || *end < *e.end_us)) {
      e.end_us = *end;
      e.ended = "the launch ended";
    }
    open[rank] = out.size();
    out.push_back(e);
  }
  return out;
}

}  // namespace

void observe(TraceFacts& facts, const json& e) {
  if (e.contains("ts")) {
    facts.end_ts = std::max(facts.end_ts, e.at("ts").get<double>() + e.value("dur", 0.0));
  }
  facts.last_pid = std::max(facts.last_pid, e.value("pid", 0));
}

int64_t origin_of(const json& other) {
  if (!other.is_object() || !other.contains(kOriginKey) || !other.at(kOriginKey).is_number()) {
    throw_error(
        "the trace has no {} (written by an older Brigade): its incidents cannot be placed; the "
        "incidents are in incidents.jsonl and each one's timeline in incidents/N/trace.json",
        kOriginKey);
  }
  return other.at(kOriginKey).get<int64_t>();
}

Marking plan_marks(const TraceFacts& facts, const std::vector<json>& records) {
  Marking out;
  int64_t origin_us = facts.origin_us;
  const int64_t trace_end_us = origin_us + static_cast<int64_t>(facts.end_ts);
  const int incidents_pid = facts.last_pid + 1;

  // Incidents: those whose detection-to-recovery overlaps the trace; one
  // detected before zero (the restart this generation recovered from)
  // opens the window there.
  std::vector<Mark> marks;
  int64_t window_begin = origin_us;
  for (const json& r : records) {
    const std::string kind = r.value("kind", "");
    if (kind == "summary" || kind.starts_with("straggler")) continue;
    std::optional<Mark> m = incident_mark(r, incidents_pid);
    if (!m || m->end_us < origin_us || m->begin_us > trace_end_us) continue;
    window_begin = std::min(window_begin, m->begin_us);
    marks.push_back(std::move(*m));
  }
  // Episodes: cut to the window; one whose end is not known runs to the
  // trace's end if it was named within it.
  for (const Episode& e : episodes(records)) {
    const int64_t named = e.named->at("unix_us").get<int64_t>();
    if (named > trace_end_us) continue;
    if (e.end_us ? *e.end_us <= window_begin : named < window_begin) continue;
    const int64_t end = std::min(e.end_us.value_or(trace_end_us), trace_end_us);
    Mark m = straggler_mark(*e.named, end, e.end_us ? e.ended : "not seen: to the trace's end");
    m.begin_us = std::max(named, window_begin);
    marks.push_back(std::move(m));
  }
  out.count = static_cast<int>(marks.size());
  out.origin_us = origin_us;
  if (marks.empty()) return out;

  // A restart before zero moves zero back, as diag/trace.h's join does for
  // a rank that opened its window first: the viewers drop negative times.
  if (window_begin < origin_us) {
    out.shift_us = static_cast<double>(origin_us - window_begin);
    origin_us = window_begin;
    out.origin_us = origin_us;
  }
  bool any_incident = false;
  std::set<std::string> machines;
  for (Mark& m : marks) {
    machines.insert(m.boot_id);
    for (json& e : m.events) {
      if (!e.contains("ts")) {
        out.events.push_back(std::move(e));
        continue;
      }
      // Cut to the window (a restart span past the trace's end).
      const int64_t begin = std::max(m.begin_us, origin_us);
      if (e.contains("dur")) {
        e["dur"] =
            static_cast<double>(std::max<int64_t>(0, std::min(m.end_us, trace_end_us) - begin));
        e["ts"] = static_cast<double>(begin - origin_us);
      } else {
        e["ts"] = static_cast<double>(e.at("ts").get<int64_t>() - origin_us);
      }
      if (e.value("cat", "") == kIncidentCategory) any_incident = true;
      out.events.push_back(std::move(e));
    }
  }
  const bool one_machine =
      !facts.boot_id.empty() && machines.size() == 1 && *machines.begin() == facts.boot_id;
  out.marks_clock = one_machine
                        ? "rank 0's machine (boot ids equal): the marks line up with the steps to "
                          "the wall clock's slew between the conversions"
                        : "wall clocks of different machines (or of unknown ones): the marks line "
                          "up with the steps to the machines' clock synchronisation";
  if (any_incident) {
    const auto meta = [&](const char* what, int64_t tid, json args) {
      out.events.push_back({{"ph", "M"},
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
  return out;
}

void apply_to_other_data(json& other, const Marking& m) {
  other[kOriginKey] = m.origin_us;
  if (m.marks_clock.is_null()) {
    other.erase(kMarksClockKey);
  } else {
    other[kMarksClockKey] = m.marks_clock;
  }
}

}  // namespace trace_marks

int mark_incidents(json& trace, const std::vector<json>& records) {
  using namespace trace_marks;
  json& other = trace["otherData"];
  TraceFacts facts;
  facts.origin_us = origin_of(other);
  facts.boot_id = other.value(kBootIdKey, "");
  json& events = trace.at("traceEvents");
  json kept = json::array();
  for (json& e : events) {
    if (is_mark(e)) continue;
    observe(facts, e);
    kept.push_back(std::move(e));
  }
  events = std::move(kept);
  Marking m = plan_marks(facts, records);
  if (m.shift_us != 0) shift_trace_events(events, m.shift_us);
  apply_to_other_data(other, m);
  for (json& e : m.events) events.push_back(std::move(e));
  return m.count;
}

}  // namespace brigade::diag

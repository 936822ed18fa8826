// What marking a trace needs of its events and what the marks change in it,
// shared by mark_incidents (a parsed trace, trace_incidents.cc) and
// mark_launch_traces (a trace streamed one event at a time,
// trace_marking.cc); diag's own, not for other layers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace brigade::diag::trace_marks {

// An incident's or a straggler's mark (what marking again replaces).
bool is_mark(const nlohmann::json& e);

// A record's number at `key`, none when missing or not a number.
std::optional<int64_t> stamp(const nlohmann::json& record, const char* key);

// What the marks need of a trace's own events (its marks left out).
struct TraceFacts {
  int64_t origin_us = 0;
  double end_ts = 0;  // the last event's end, from zero
  int last_pid = 0;
  std::string boot_id;  // rank 0's machine
};

void observe(TraceFacts& facts, const nlohmann::json& e);

// otherData's zero; Error when it has none (written by an older Brigade).
int64_t origin_of(const nlohmann::json& other);

// The marks of the records on a trace, and what they change in it.
struct Marking {
  int count = 0;
  std::vector<nlohmann::json> events;  // on the (possibly moved) zero
  int64_t origin_us = 0;               // the zero, moved back by a restart before it
  double shift_us = 0;                 // what every earlier event moves by
  nlohmann::json marks_clock;          // otherData's marks_clock (null: none)
};

Marking plan_marks(const TraceFacts& facts, const std::vector<nlohmann::json>& records);

void apply_to_other_data(nlohmann::json& other, const Marking& m);

}  // namespace brigade::diag::trace_marks

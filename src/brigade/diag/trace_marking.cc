// mark_launch_traces (trace_incidents.h): the run directory's trace files
// marked one event at a time; what the marks are is trace_incidents.cc's.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/diag/trace.h"
#include "brigade/diag/trace_incidents.h"
#include "brigade/diag/trace_marks.h"

namespace brigade::diag {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace trace_marks;

namespace {

// incidents.jsonl's records; Error when it cannot be read (its marks must
// then stay as they are). A line that is not a JSON object (torn by a kill)
// is passed over. By read(2), not core's read_file: an ifstream reads a
// directory as an empty file (no error), and no records would erase every
// mark (MarkLaunchTraces.AnIncidentsFileThatCannotBeReadLeavesTheMarks).
std::vector<json> read_records(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_error("cannot open {}: {}", path.string(), std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_error("cannot read {}: {}", path.string(), std::strerror(err));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  std::vector<json> records;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    json record = json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin),
                              text.begin() + static_cast<std::ptrdiff_t>(end), nullptr,
                              /*allow_exceptions=*/false);
    if (record.is_object()) records.push_back(std::move(record));
    begin = end + 1;
  }
  return records;
}

// The launcher ran out of the time it had to mark (LaunchTraces::out_of_time).
struct OutOfTime {};

void check_time(const LaunchTraces& launch) {
  if (launch.out_of_time && launch.out_of_time()) throw OutOfTime{};
}

// How far the file system's clock may be from the launcher's: another
// machine's (rank 0's node, an NFS server), and file times of whole seconds.
constexpr std::chrono::seconds kFileClockSlack{60};

// Earlier than this launch by its file's time: written well before the
// launch started. Anything closer is told by its zero instead.
bool written_before(const fs::path& path, int64_t launched_unix_us) {
  std::error_code ec;
  const auto written = fs::last_write_time(path, ec);
  if (ec) return false;
  const auto sys = std::chrono::file_clock::to_sys(written);
  return std::chrono::duration_cast<std::chrono::microseconds>(sys.time_since_epoch()).count() <
         launched_unix_us - std::chrono::microseconds(kFileClockSlack).count();
}

// Removes run_dir's temporaries of trace files (core/files.h's
// AtomicFileWriter names); returns how many.
int remove_dead_temporaries(const fs::path& run_dir) {
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.find(".tmp.");
    if (tmp == std::string::npos) continue;
    const std::string target = name.substr(0, tmp);
    if (!is_trace_file_name(target) || !is_atomic_temp_of(name, target)) continue;
    std::error_code gone;
    if (fs::remove(entry.path(), gone)) ++removed;
  }
  return removed;
}

constexpr size_t kCheckEvery = 4096;  // events between the checks of time
constexpr size_t kFlushBytes = size_t{1} << 20;

// One streamed pass over a trace file: nlohmann's parse with a callback
// that is handed each element of traceEvents as it is completed, then drops
// it (one event in memory), and the top-level members kept (otherData and
// the like, small). on_member(key, value) after each member; false from it
// stops the pass (the parse is abandoned, what follows is not read).
// Returns the members, traceEvents empty; Error when it is not a trace.
json stream_trace(const fs::path& path,
                  const std::function<bool(const std::string& key, const json& value)>& on_member,
                  const std::function<void(json& event)>& on_event) {
  struct Stop {};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("cannot open {}: {}", path.string(), std::strerror(errno));
  std::string member;  // the top-level member being read
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key) {
      member = parsed.get<std::string>();
      return true;
    }
    const bool completed = event == json::parse_event_t::object_end ||
                           event == json::parse_event_t::array_end ||
                           event == json::parse_event_t::value;
    if (!completed) return true;
    if (depth == 2 && member == "traceEvents") {
      on_event(parsed);
      return false;  // dropped from the array, which stays empty
    }
    if (depth == 1 && member != "traceEvents" && !on_member(member, parsed)) throw Stop{};
    return true;
  };
  json members;
  try {
    members = json::parse(in, callback);
  } catch (const Stop&) {
    return json();
  } catch (const json::exception& e) {
    throw_error("{} is not a whole trace: {}", path.string(), e.what());
  }
  if (!members.is_object() || !members.contains("traceEvents") ||
      !members.at("traceEvents").is_array()) {
    throw_error("{} is not a whole trace: no traceEvents", path.string());
  }
  return members;
}

// Marks one trace of this launch by two passes over the file: the first
// validates it and reads what the marks need (an earlier launch's trace is
// known by its otherData, which Brigade writes first, before any event is
// read), the second streams it, earlier marks left out, into the file that
// replaces it. Untouched when nothing changes or anything fails.
void mark_trace_file(const fs::path& path, const std::vector<json>& records,
                     const LaunchTraces& launch) {
  bool earlier_launch = false;
  TraceFacts facts;
  std::vector<size_t> old_marks;  // indices in traceEvents
  size_t index = 0;
  json members = stream_trace(
      path,
      [&](const std::string& key, const json& value) {
        if (key == "otherData" && value.is_object() && value.contains(kOriginKey) &&
            value.at(kOriginKey).is_number() &&
            value.at(kOriginKey).get<int64_t>() < launch.launched_unix_us) {
          earlier_launch = true;  // of the same name, left by an earlier launch
          return false;
        }
        return true;
      },
      [&](json& e) {
        if (index % kCheckEvery == 0) check_time(launch);
        if (is_mark(e)) {
          old_marks.push_back(index);
        } else {
          observe(facts, e);
        }
        ++index;
      });
  if (earlier_launch) return;
  json& other = members["otherData"];
  facts.origin_us = origin_of(other);
  facts.boot_id = other.value(kBootIdKey, "");
  const Marking m = plan_marks(facts, records);
  if (m.count == 0 && old_marks.empty()) return;
  apply_to_other_data(other, m);

  AtomicFileWriter out(path);
  std::string buffer;
  const auto flush = [&](bool always) {
    if (always || buffer.size() >= kFlushBytes) {
      out.write(buffer);
      buffer.clear();
    }
  };
  // Members in nlohmann's order (sorted), as diag/trace.h writes them.
  buffer.push_back('{');
  bool first_member = true;
  const auto member_key = [&](const std::string& key) {
    if (!first_member) buffer.push_back(',');
    first_member = false;
    buffer += json(key).dump();
    buffer.push_back(':');
  };
  const auto write_events = [&] {
    member_key("traceEvents");
    buffer.push_back('[');
    bool first = true;
    const auto add = [&](const json& e) {
      if (!first) buffer.push_back(',');
      first = false;
      buffer += e.dump();
      flush(false);
    };
    size_t i = 0, next_old = 0;
    stream_trace(
        path, [](const std::string&, const json&) { return true; },
        [&](json& e) {
          if (i % kCheckEvery == 0) check_time(launch);
          const size_t at = i++;
          if (next_old < old_marks.size() && old_marks[next_old] == at) {
            ++next_old;
            return;
          }
          if (m.shift_us == 0) return add(e);
          json one = json::array({std::move(e)});
          shift_trace_events(one, m.shift_us);
          add(one.at(0));
        });
    for (const json& e : m.events) add(e);
    buffer.push_back(']');
  };
  bool events_written = false;
  for (const auto& [key, value] : members.items()) {
    if (key == "traceEvents") continue;
    if (!events_written && key > std::string("traceEvents")) {
      write_events();
      events_written = true;
    }
    member_key(key);
    buffer += value.dump();
  }
  if (!events_written) write_events();
  buffer += "}\n";
  flush(true);
  out.commit();
}

}  // namespace

std::vector<std::string> mark_launch_traces(const fs::path& run_dir, const LaunchTraces& launch) {
  std::vector<std::string> said;
  if (const int removed = remove_dead_temporaries(run_dir); removed > 0) {
    said.push_back(fmt::format(
        "removed {} unfinished rewrite{} of the run's traces from {} (a launcher stopped while "
        "marking them)",
        removed, removed == 1 ? "" : "s", run_dir.string()));
  }
  const fs::path incidents_path = run_dir / "incidents.jsonl";
  std::error_code ec;
  if (!fs::exists(incidents_path, ec)) return said;
  std::vector<json> records;
  try {
    records = read_records(incidents_path);
  } catch (const std::exception& e) {
    said.push_back(fmt::format("the run's traces are left as they were: {}", e.what()));
    return said;
  }
  // A straggler named by an earlier launch that never saw it end (killed
  // before its summary) belongs to that launch: its episode would otherwise
  // run to this launch's first stop and across this launch's traces.
  std::erase_if(records, [&](const json& r) {
    const std::string kind = r.value("kind", "");
    const auto at = stamp(r, "unix_us");
    return (kind == "straggler" || kind == "straggler_recovered") && at &&
           *at < launch.launched_unix_us;
  });
  std::vector<std::string> out_of_time;
  for (int64_t g = 0; g <= launch.last_generation; ++g) {
    const std::string name = trace_file_name(g);
    const fs::path path = run_dir / name;
    if (!fs::is_regular_file(path, ec)) continue;  // this generation traced nothing
    // Of the same name, left by an earlier launch (the run resumed into the
    // directory): known without reading it.
    if (written_before(path, launch.launched_unix_us)) continue;
    if (!out_of_time.empty()) {
      out_of_time.push_back(name);
      continue;
    }
    try {
      check_time(launch);
      const uintmax_t bytes = fs::file_size(path);
      if (bytes > launch.max_bytes) {
        throw_error(
            "{:.1f} MiB, more than the {:.1f} MiB the launcher reads to mark a trace (about "
            "{:.0f} s); its incidents are in incidents.jsonl",
            static_cast<double>(bytes) / (1 << 20),
            static_cast<double>(launch.max_bytes) / (1 << 20),
            static_cast<double>(launch.max_bytes) / kMarkedBytesPerSecond);
      }
      mark_trace_file(path, records, launch);
    } catch (const OutOfTime&) {
      out_of_time.push_back(name);
    } catch (const std::exception& e) {
      said.push_back(fmt::format("could not mark the run's incidents in {} (left as it was): {}",
                                 path.string(), e.what()));
    }
  }
  if (!out_of_time.empty()) {
    std::string names;
    for (const std::string& n : out_of_time) names += (names.empty() ? "" : ", ") + n;
    said.push_back(fmt::format(
        "out of time to mark the run's incidents (stopped by a signal): {} in {} left as {} "
        "(the incidents are in incidents.jsonl)",
        names, run_dir.string(), out_of_time.size() == 1 ? "it was" : "they were"));
  }
  return said;
}

}  // namespace brigade::diag

// The run's incidents marked in its trace (diag/trace_incidents.h), from a
// hand-written trace and incidents.jsonl: an incident detected before the
// trace's zero moves zero back to its detection (the steps move with it),
// its restart span runs to the recovery, a straggler episode is a span on
// its rank's process from named to recovered, or to what ended it unseen
// (the next incident, a new naming, its launch's end), never outside the
// trace's window nor moving its zero; a rejoin is no incident with a
// timeline; the file says whose clocks placed the marks; marking twice gives
// the same file, and a trace without its wall-clock zero is refused. The
// launcher's pass over a run directory marks only its launch's traces
// (an earlier launch's known without reading its events), streamed as the
// parsed trace would be marked, in memory that does not grow with the
// trace, within a deadline after a signal; leaves them as they were when
// incidents.jsonl cannot be read, a trace is too large, malformed or cannot
// be rewritten, or time ran out; removes what a launcher killed while
// rewriting one left. The trace and the report number incidents
// alike. The whole path from an injected fault runs in
// tests/cli/trace_incidents_test.cc.
#include "brigade/diag/trace_incidents.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/diag/report.h"
#include "testing/temp_dir.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kOrigin = 1'700'000'000'000'000;  // the trace's zero, unix us

// Rank 0's steps 1 and 2: 100-200 us and 300-400 us.
json hand_trace() {
  json events = json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", 1},
                    {"tid", 0},
                    {"args", {{"name", "rank 0 (node 0)"}}}});
  for (int step = 1; step <= 2; ++step) {
    events.push_back({{"ph", "X"},
                      {"name", "step " + std::to_string(step)},
                      {"cat", "step"},
                      {"pid", 1},
                      {"tid", 7},
                      {"ts", 100.0 + 200.0 * (step - 1)},
                      {"dur", 100.0}});
  }
  // A collective run at 130 us, called at 120 us.
  events.push_back({{"ph", "X"},
                    {"name", "all_reduce"},
                    {"cat", "comm"},
                    {"pid", 1},
                    {"tid", int64_t{1} << 30},
                    {"ts", 130.0},
                    {"dur", 20.0},
                    {"args", {{"called_us", 120.0}}}});
  return {{"traceEvents", events},
          {"otherData", {{"origin_unix_us", kOrigin}, {"boot_id", "machine-a"}}}};
}

std::vector<json> hand_records() {
  return {// Detected 50 us before zero, recovered within step 1.
          {{"kind", "crash"},
           {"rank", 1},
           {"node", 0},
           {"number", 3},
           {"cause", "incident 3: rank 1 (node 0) crashed"},
           {"fault_unix_us", kOrigin - 60},
           {"detected_unix_us", kOrigin - 50},
           {"recovered_unix_us", kOrigin + 150}},
          {{"kind", "straggler"}, {"rank", 0}, {"section", "compute"}, {"unix_us", kOrigin + 320}},
          {{"kind", "straggler_recovered"}, {"rank", 0}, {"unix_us", kOrigin + 380}},
          // Long after the trace's end.
          {{"kind", "hang"},
           {"rank", 0},
           {"number", 4},
           {"detected_unix_us", kOrigin + 10'000'000},
           {"recovered_unix_us", kOrigin + 11'000'000}},
          {{"kind", "summary"}}};
}

std::vector<json> with_category(const json& trace, const std::string& category) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") == category && e.at("ph") != "M") out.push_back(e);
  }
  return out;
}

json event_named(const json& trace, const std::string& name) {
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("name", "") == name) return e;
  }
  ADD_FAILURE() << "no event " << name;
  return json::object();
}

TEST(TraceIncidents, MarksWhatOverlapsTheTraceOnItsClock) {
  json trace = hand_trace();
  EXPECT_EQ(mark_incidents(trace, hand_records()), 2);
  // Zero moved back to the detection, 50 us: every time with it (the
  // collective's call too), the fault before it is not drawn.
  EXPECT_EQ(trace.at("otherData").at("origin_unix_us").get<int64_t>(), kOrigin - 50);
  EXPECT_DOUBLE_EQ(event_named(trace, "step 1").at("ts").get<double>(), 150.0);
  const json collective = event_named(trace, "all_reduce");
  EXPECT_DOUBLE_EQ(collective.at("ts").get<double>(), 180.0);
  EXPECT_DOUBLE_EQ(collective.at("args").at("called_us").get<double>(), 170.0);
  const std::vector<json> incident = with_category(trace, "incident");
  ASSERT_EQ(incident.size(), 2u);  // detected, and the restart; not incident 4
  for (const json& e : incident) {
    EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 0.0) << e;
    EXPECT_EQ(e.at("pid"), 2) << e;  // after the ranks' processes
    EXPECT_EQ(e.at("args").at("kind"), "crash") << e;
    EXPECT_EQ(e.at("args").at("rank"), 1) << e;
    EXPECT_EQ(e.at("args").at("timeline"), "incidents/3/trace.json") << e;
    if (e.at("ph") == "X") {
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 200.0) << e;
    }
  }
  const std::vector<json> straggler = with_category(trace, "straggler");
  ASSERT_EQ(straggler.size(), 1u);
  EXPECT_EQ(straggler[0].at("pid"), 1);
  EXPECT_DOUBLE_EQ(straggler[0].at("ts").get<double>(), 370.0);
  EXPECT_DOUBLE_EQ(straggler[0].at("dur").get<double>(), 60.0);
  EXPECT_EQ(straggler[0].at("args").at("ended"), "recovered");

  // Marking again replaces the marks: the same file.
  const std::string once = trace.dump();
  EXPECT_EQ(mark_incidents(trace, hand_records()), 2);
  EXPECT_EQ(trace.dump(), once);
}

TEST(TraceIncidents, AnOpenEpisodeRunsToTheTracesEnd) {
  json trace = hand_trace();
  std::vector<json> records = {
      {{"kind", "straggler"}, {"rank", 0}, {"section", "compute"}, {"unix_us", kOrigin + 120}}};
  EXPECT_EQ(mark_incidents(trace, records), 1);
  const std::vector<json> straggler = with_category(trace, "straggler");
  ASSERT_EQ(straggler.size(), 1u);
  EXPECT_DOUBLE_EQ(straggler[0].at("ts").get<double>(), 120.0);
  EXPECT_DOUBLE_EQ(straggler[0].at("dur").get<double>(), 280.0);  // to step 2's end
}

TEST(TraceIncidents, ATraceWithoutItsWallClockZeroIsRefused) {
  json trace = hand_trace();
  trace["otherData"].erase("origin_unix_us");
  try {
    mark_incidents(trace, hand_records());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("origin_unix_us"), std::string::npos) << e.what();
  }
}

json straggler_named(int rank, int64_t at) {
  return {{"kind", "straggler"}, {"rank", rank},  {"section", "compute"},
          {"ratio", 4.0},        {"unix_us", at}, {"boot_id", "machine-a"}};
}

// The review's case: a rank named in an earlier generation (or an earlier
// launch into the same directory) and never seen to recover, since its
// workers were stopped. It ended there: a later trace shows no straggler
// and keeps its zero (it began 6 s early with a false span).
TEST(TraceIncidents, AnEpisodeOpenAtAnIncidentOrItsLaunchsEndStaysOutOfLaterTraces) {
  // A launch killed outright leaves no summary: its episode's end is not
  // known, and it is not drawn in a trace it was not named in.
  for (const char* ended_by : {"incident", "launch end", "launch killed"}) {
    json trace = hand_trace();
    std::vector<json> records = {straggler_named(1, kOrigin - 6'000'000)};
    if (ended_by == std::string("launch killed")) {
      // nothing after it
    } else if (ended_by == std::string("incident")) {
      records.push_back({{"kind", "crash"},
                         {"rank", 0},
                         {"number", 1},
                         {"detected_unix_us", kOrigin - 5'000'000},
                         {"recovered_unix_us", kOrigin - 4'000'000}});
    } else {
      records.push_back({{"kind", "summary"}, {"unix_us", kOrigin - 3'000'000}});
    }
    EXPECT_EQ(mark_incidents(trace, records), 0) << ended_by;
    EXPECT_EQ(trace.at("otherData").at("origin_unix_us").get<int64_t>(), kOrigin) << ended_by;
    EXPECT_TRUE(with_category(trace, "straggler").empty()) << ended_by;
  }
}

// Within the trace: an episode ends where the rank is named again, at the
// next incident's detection, or at the launch's end, the first of them.
TEST(TraceIncidents, AnEpisodeEndsAtWhatEndedItFirst) {
  json trace = hand_trace();  // 0-400 us
  std::vector<json> records = {
      straggler_named(0, kOrigin + 120),
      straggler_named(0, kOrigin + 200),  // named again: a new episode
      straggler_named(1, kOrigin + 150),
      {{"kind", "hang"}, {"rank", 1}, {"number", 2}, {"detected_unix_us", kOrigin + 250}},
      straggler_named(1, kOrigin + 300),
      {{"kind", "summary"}, {"unix_us", kOrigin + 350}}};
  EXPECT_EQ(mark_incidents(trace, records), 5);
  std::map<std::pair<int, double>, json> spans;  // by (pid, ts)
  for (const json& e : with_category(trace, "straggler")) {
    spans[{e.at("pid").get<int>(), e.at("ts").get<double>()}] = e;
  }
  ASSERT_EQ(spans.size(), 4u);
  const auto expect = [&](int rank, double ts, double dur, const std::string& ended) {
    const json& e = spans[{rank + 1, ts}];
    ASSERT_TRUE(e.is_object()) << "no span of rank " << rank << " at " << ts;
    EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), dur) << e;
    EXPECT_EQ(e.at("args").at("ended"), ended) << e;
  };
  expect(0, 120, 80, "named again");
  expect(0, 200, 50, "the workers stopped for an incident");
  expect(1, 150, 100, "the workers stopped for an incident");
  expect(1, 300, 50, "the launch ended");
}

// An episode that began before the trace and recovered within it is drawn
// from the trace's zero, which stays where it was.
TEST(TraceIncidents, AnEpisodeIsCutToTheTracesWindow) {
  json trace = hand_trace();
  std::vector<json> records = {
      straggler_named(1, kOrigin - 1'000),
      {{"kind", "straggler_recovered"}, {"rank", 1}, {"unix_us", kOrigin + 150}},
      straggler_named(0, kOrigin + 300),
      {{"kind", "straggler_recovered"}, {"rank", 0}, {"unix_us", kOrigin + 900}}};
  EXPECT_EQ(mark_incidents(trace, records), 2);
  EXPECT_EQ(trace.at("otherData").at("origin_unix_us").get<int64_t>(), kOrigin);
  EXPECT_DOUBLE_EQ(event_named(trace, "step 1").at("ts").get<double>(), 100.0);
  for (const json& e : with_category(trace, "straggler")) {
    if (e.at("pid") == 2) {
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 0.0) << e;
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 150.0) << e;
    } else {
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 300.0) << e;
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 100.0) << e;  // to the trace's end
    }
  }
}

// A rejoin stopped the job to grow it back: no failure and no timeline of
// its own, drawn as what it is.
TEST(TraceIncidents, ARejoinIsDrawnWithoutATimeline) {
  json trace = hand_trace();
  std::vector<json> records = {{{"kind", "rejoin"},
                                {"restart", false},
                                {"rank", -1},
                                {"node", 1},
                                {"number", 2},
                                {"detected_unix_us", kOrigin + 210},
                                {"recovered_unix_us", kOrigin + 290}}};
  EXPECT_EQ(mark_incidents(trace, records), 1);
  const std::vector<json> marks = with_category(trace, "incident");
  ASSERT_EQ(marks.size(), 2u);
  for (const json& e : marks) {
    EXPECT_FALSE(e.at("args").contains("timeline")) << e;
    EXPECT_EQ(e.at("name").get<std::string>().find("incident"), std::string::npos) << e;
    EXPECT_NE(e.at("name").get<std::string>().find("node 1 rejoined"), std::string::npos) << e;
  }
}

// Whose clocks placed the marks: rank 0's machine (its boot id) or another.
TEST(TraceIncidents, TheTraceSaysWhoseClocksPlacedItsMarks) {
  for (const std::string machine : {"machine-a", "machine-b"}) {
    json trace = hand_trace();
    json named = straggler_named(0, kOrigin + 120);
    named["boot_id"] = machine;
    EXPECT_EQ(mark_incidents(trace, {named}), 1);
    const std::string clock = trace.at("otherData").at("marks_clock");
    EXPECT_EQ(clock.starts_with("rank 0's machine"), machine == "machine-a") << clock;
  }
}

// The launcher's pass over a run directory.
class MarkLaunchTraces : public ::testing::Test {
 protected:
  MarkLaunchTraces() {
    std::vector<std::string> lines;
    for (const json& r : hand_records()) lines.push_back(r.dump());
    write_lines(lines);
  }
  void write_lines(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    write_file_atomic(dir_.path() / "incidents.jsonl", text);
  }
  fs::path write_trace(const std::string& name, int64_t origin) {
    json trace = hand_trace();
    trace["otherData"]["origin_unix_us"] = origin;
    write_file_atomic(dir_.path() / name, trace.dump() + "\n");
    return dir_.path() / name;
  }
  static int marks_in(const fs::path& path) {
    int n = 0;
    const json trace = json::parse(read_file(path));
    for (const json& e : trace.at("traceEvents")) {
      n += e.value("cat", "") == "incident" || e.value("cat", "") == "straggler";
    }
    return n;
  }

  testing::TempDir dir_{"brigade_mark_traces"};
  LaunchTraces launch_{1, kOrigin - 1'000'000};  // generations 0 and 1
};

TEST_F(MarkLaunchTraces, MarksOnlyTheTracesThisLaunchWrote) {
  // The earlier launch's own incident, within its trace (marked by it).
  std::vector<std::string> lines;
  for (const json& r : hand_records()) lines.push_back(r.dump());
  lines.push_back(json{{"kind", "crash"},
                       {"rank", 0},
                       {"number", 1},
                       {"detected_unix_us", kOrigin - 2'000'000 + 100},
                       {"recovered_unix_us", kOrigin - 2'000'000 + 200}}
                      .dump());
  write_lines(lines);
  const fs::path mine = write_trace("trace.gen1.json", kOrigin);
  const fs::path earlier = write_trace("trace.json", kOrigin - 2'000'000);  // a launch before
  const fs::path beyond = write_trace("trace.gen2.json", kOrigin);          // not this launch's
  const std::string earlier_bytes = read_file(earlier), beyond_bytes = read_file(beyond);
  EXPECT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  EXPECT_GT(marks_in(mine), 0);
  EXPECT_EQ(read_file(earlier), earlier_bytes);
  EXPECT_EQ(read_file(beyond), beyond_bytes);
}

TEST_F(MarkLaunchTraces, AStragglerAnEarlierLaunchNeverSawEndIsNotDrawnInThisLaunchsTrace) {
  // Named 6 s before this launch began by a launch killed before its
  // summary; this launch's summary comes after its own trace.
  write_lines({json{{"kind", "straggler"},
                    {"rank", 1},
                    {"step", 3},
                    {"factor", 4.0},
                    {"unix_us", kOrigin - 6'000'000}}
                   .dump(),
               json{{"kind", "summary"}, {"unix_us", kOrigin + 20'000'000}}.dump()});
  const fs::path trace = write_trace("trace.json", kOrigin);
  EXPECT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  EXPECT_EQ(marks_in(trace), 0);
}

TEST_F(MarkLaunchTraces, AnIncidentsFileThatCannotBeReadLeavesTheMarks) {
  const fs::path trace = write_trace("trace.json", kOrigin);
  ASSERT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  const std::string marked = read_file(trace);
  ASSERT_GT(marks_in(trace), 0);
  fs::remove(dir_.path() / "incidents.jsonl");
  fs::create_directory(dir_.path() / "incidents.jsonl");  // read() fails: EISDIR
  const std::vector<std::string> said = mark_launch_traces(dir_.path(), launch_);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("left as they were"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("incidents.jsonl"), std::string::npos) << said[0];
  EXPECT_EQ(read_file(trace), marked);
}

TEST_F(MarkLaunchTraces, ALargeOrMalformedTraceIsSaidInOneLineAndLeft) {
  const fs::path large = write_trace("trace.json", kOrigin);
  const fs::path malformed = dir_.path() / "trace.gen1.json";
  write_file_atomic(malformed, R"({"traceEvents": [{"ph": "X", "ts": )");
  const std::string large_bytes = read_file(large);
  LaunchTraces small = launch_;
  small.max_bytes = large_bytes.size() - 1;
  const std::vector<std::string> said = mark_launch_traces(dir_.path(), small);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_NE(said[0].find("more than the"), std::string::npos) << said[0];
  EXPECT_NE(said[1].find("trace.gen1.json"), std::string::npos) << said[1];
  EXPECT_EQ(read_file(large), large_bytes);
  EXPECT_EQ(read_file(malformed), R"({"traceEvents": [{"ph": "X", "ts": )");
}

int entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

// The rewrite fails (here past the file-size limit: a full disk alike): the
// trace stays as it was, no temporary is left.
TEST_F(MarkLaunchTraces, AFailedRewriteLeavesTheTrace) {
  const fs::path trace = write_trace("trace.json", kOrigin);
  const std::string before = read_file(trace);
  const int files = entries(dir_.path());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write() says EFBIG instead
  rlimit small = old;
  small.rlim_cur = before.size() + 100;  // the marks do not fit
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::vector<std::string> said = mark_launch_traces(dir_.path(), launch_);
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("left as it was"), std::string::npos) << said[0];
  EXPECT_EQ(read_file(trace), before);
  EXPECT_EQ(entries(dir_.path()), files);
}

// The streamed marking writes what marking the parsed trace gives (zero
// moved back, earlier marks replaced), and marking again changes nothing.
TEST_F(MarkLaunchTraces, TheStreamedMarksAreThoseOfTheParsedTrace) {
  json expected = hand_trace();
  ASSERT_EQ(mark_incidents(expected, hand_records()), 2);
  const fs::path trace = write_trace("trace.json", kOrigin);
  ASSERT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  EXPECT_EQ(json::parse(read_file(trace)), expected);
  const std::string once = read_file(trace);
  ASSERT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  EXPECT_EQ(read_file(trace), once);
}

void set_written(const fs::path& path, int64_t unix_us) {
  using namespace std::chrono;
  fs::last_write_time(path, file_clock::from_sys(sys_time<microseconds>(microseconds(unix_us))));
}

// A resumed launch knows an earlier launch's trace of the same name without
// reading its events: by the file's time when it is over a minute before
// the launch (the file system's clock may be another machine's), else by
// its zero, which comes first in the file. Here the events are not even
// JSON: reading them would say so.
TEST_F(MarkLaunchTraces, AnEarlierLaunchsTraceIsKnownWithoutReadingItsEvents) {
  const std::string earlier_head =
      R"({"otherData":{"origin_unix_us":)" + std::to_string(kOrigin - 2'000'000) + "},";
  const std::string garbage = R"("traceEvents":[{"ph":"X","ts":}])";
  write_file_atomic(dir_.path() / "trace.json", earlier_head + garbage);
  // Written minutes before this launch began: not opened at all, even
  // without a zero.
  write_file_atomic(dir_.path() / "trace.gen1.json", "{" + garbage + "}");
  set_written(dir_.path() / "trace.gen1.json", launch_.launched_unix_us - 120'000'000);
  EXPECT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  EXPECT_EQ(read_file(dir_.path() / "trace.json"), earlier_head + garbage);
  // This launch's (written since it began, or a second "before" it by a
  // clock that differs from the launcher's) with the same bytes is read,
  // and refused in one line.
  for (const int64_t written :
       {launch_.launched_unix_us - 1'000'000, launch_.launched_unix_us + 1'000'000}) {
    set_written(dir_.path() / "trace.gen1.json", written);
    const std::vector<std::string> said = mark_launch_traces(dir_.path(), launch_);
    ASSERT_EQ(said.size(), 1u) << written - launch_.launched_unix_us;
    EXPECT_NE(said[0].find("trace.gen1.json"), std::string::npos) << said[0];
  }
}

// A trace of `events` steps on rank 0, 10 us apart, written as the join does
// (otherData first), without building it in memory.
fs::path write_long_trace(const fs::path& path, int64_t events) {
  std::ofstream out(path);
  out << R"({"displayTimeUnit":"ms","otherData":{"boot_id":"machine-a","origin_unix_us":)"
      << kOrigin << R"(},"traceEvents":[)";
  for (int64_t i = 0; i < events; ++i) {
    out << (i == 0 ? "" : ",") << R"({"args":{"step":)" << i
        << R"(},"cat":"step","dur":5.0,"name":"step","ph":"X","pid":1,"tid":7,"ts":)" << 10 * i
        << ".0}";
  }
  out << "]}\n";
  return path;
}

int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field)) return std::stoll(line.substr(std::strlen(field) + 1));
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// Marking holds one event at a time: a trace's parse tree is about eight
// times the file, which for the largest trace marked was a gigabyte in the
// launcher.
TEST_F(MarkLaunchTraces, ALargeTraceIsMarkedInMemoryThatDoesNotGrowWithIt) {
  const fs::path trace = write_long_trace(dir_.path() / "trace.json", 250'000);
  const auto bytes = static_cast<int64_t>(fs::file_size(trace));
  ASSERT_GT(bytes, 24 << 20);
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak (VmHWM) starts again from here
  const int64_t before_kib = status_kib("VmRSS:");
  ASSERT_LE(status_kib("VmHWM:"), before_kib + 1024);
  const auto began = std::chrono::steady_clock::now();
  ASSERT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - began;
  const int64_t grown_kib = status_kib("VmHWM:") - before_kib;
  EXPECT_LT(grown_kib * 1024, bytes / 4) << "the peak grew by " << grown_kib << " KiB";
  std::printf("marking %lld bytes took %.2f s, the peak grew by %lld KiB\n",
              static_cast<long long>(bytes), took.count(), static_cast<long long>(grown_kib));
  const json marked = json::parse(read_file(trace));
  // The incident (detected, restart), the straggler (its track, its span),
  // the incidents process (name, order, track).
  EXPECT_EQ(marked.at("traceEvents").size(), 250'000u + 7u);
}

// A launcher stopped by a signal marks until its deadline: what is left is
// untouched (a half-read trace too, and one half rewritten) and named in
// one line.
TEST_F(MarkLaunchTraces, ADeadlineLeavesWhatIsNotMarkedInTimeAndSaysSo) {
  const fs::path first = write_trace("trace.json", kOrigin);
  const fs::path second = write_trace("trace.gen1.json", kOrigin);
  const std::string bytes = read_file(first);
  LaunchTraces stopped = launch_;
  stopped.out_of_time = [] { return true; };
  std::vector<std::string> said = mark_launch_traces(dir_.path(), stopped);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("out of time"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("trace.json, trace.gen1.json"), std::string::npos) << said[0];
  EXPECT_EQ(read_file(first), bytes);
  EXPECT_EQ(read_file(second), bytes);

  // Within a trace: 10 ms for what takes a second or more.
  fs::remove(second);
  write_long_trace(first, 250'000);
  const std::string long_bytes = read_file(first);
  const auto began = std::chrono::steady_clock::now();
  stopped.out_of_time = [until = began + std::chrono::milliseconds(10)] {
    return std::chrono::steady_clock::now() >= until;
  };
  said = mark_launch_traces(dir_.path(), stopped);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::milliseconds(500));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("out of time"), std::string::npos) << said[0];
  EXPECT_EQ(read_file(first), long_bytes);
  EXPECT_EQ(entries(dir_.path()), 2);

  // Out of time in the rewrite, a part of the trace already in its
  // temporary: the temporary goes, the trace stays as it was.
  bool stopped_in_rewrite = false;
  stopped.out_of_time = [&] {
    for (const fs::directory_entry& e : fs::directory_iterator(dir_.path())) {
      if (e.path().filename().string().starts_with("trace.json.tmp.") && e.file_size() > 0) {
        return stopped_in_rewrite = true;
      }
    }
    return false;
  };
  said = mark_launch_traces(dir_.path(), stopped);
  EXPECT_TRUE(stopped_in_rewrite);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("out of time"), std::string::npos) << said[0];
  EXPECT_EQ(read_file(first), long_bytes);
  EXPECT_EQ(entries(dir_.path()), 2);  // incidents.jsonl and the trace: no temporary
}

// A launcher killed while marking (it marks with signals unblocked) leaves
// its rewrite's temporary, as large as the trace: the next marking of the
// run removes such temporaries, a live writer's name included, and nothing
// else, and says so.
TEST_F(MarkLaunchTraces, ATraceRewritesLeftoverTemporaryIsRemovedAndNothingElse) {
  const fs::path trace = write_trace("trace.json", kOrigin);
  const std::vector<std::string> dead = {"trace.json.tmp.node-0.example.org.4242.0123456789abcdef",
                                         "trace.gen7.json.tmp..1.fedcba9876543210"};
  const std::vector<std::string> others = {"trace.json.tmp.notes",
                                           "trace.json.tmp.node-0.4242.0123456789abcdeg",
                                           "trace.json.tmp.node-0.x.0123456789abcdef",
                                           "trace.genx.json.tmp.h.1.0123456789abcdef",
                                           "my-trace.json.tmp.h.1.0123456789abcdef",
                                           "metrics.jsonl.tmp.h.1.0123456789abcdef"};
  for (const auto& names : {dead, others}) {
    for (const std::string& name : names) write_file_atomic(dir_.path() / name, "half a trace");
  }
  AtomicFileWriter killed(dir_.path() / "trace.gen1.json");  // its temporary, as named
  killed.write("half a trace");
  const int files = entries(dir_.path());
  const std::vector<std::string> said = mark_launch_traces(dir_.path(), launch_);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("removed 3 unfinished rewrites"), std::string::npos) << said[0];
  EXPECT_EQ(entries(dir_.path()), files - 3);
  for (const std::string& name : dead) EXPECT_FALSE(fs::exists(dir_.path() / name)) << name;
  for (const std::string& name : others) {
    EXPECT_EQ(read_file(dir_.path() / name), "half a trace") << name;
  }
  EXPECT_GT(marks_in(trace), 0);
  EXPECT_TRUE(mark_launch_traces(dir_.path(), launch_).empty());  // none left: nothing said
}

// One numbering: after a rejoin (which takes a number, no directory) and
// across two launches, the trace's "incident N" is the report's "#" N.
TEST(TraceIncidents, TheTraceAndTheReportNumberIncidentsAlike) {
  testing::TempDir dir("brigade_incident_numbers");
  const auto incident = [](const char* kind, int number, int64_t at) {
    return json{{"kind", kind},
                {"rank", 0},
                {"node", 1},
                {"number", number},
                {"detected_unix_us", at},
                {"recovered_unix_us", at + 10}};
  };
  const int64_t second_launch = kOrigin + 1'000'000;
  const std::vector<json> records = {incident("crash", 1, kOrigin + 10),
                                     incident("rejoin", 2, kOrigin + 50),
                                     incident("hang", 3, kOrigin + 100), json{{"kind", "summary"}},
                                     incident("crash", 4, second_launch + 100)};
  std::string lines;
  for (const json& r : records) lines += r.dump() + "\n";
  write_file_atomic(dir.path() / "incidents.jsonl", lines);
  write_file_atomic(dir.path() / "metrics.jsonl", json{{"step", 1}, {"loss", 4.0}}.dump() + "\n");
  std::vector<int64_t> traced, rejoined;
  for (const int64_t origin : {kOrigin, second_launch}) {
    json trace = hand_trace();
    trace["otherData"]["origin_unix_us"] = origin;
    mark_incidents(trace, records);
    for (const json& e : with_category(trace, "incident")) {
      if (e.at("ph") != "i") continue;
      const int64_t number = e.at("args").at("number");
      if (e.at("args").at("kind") == "rejoin") {
        rejoined.push_back(number);
      } else {
        traced.push_back(number);
        EXPECT_TRUE(
            e.at("name").get<std::string>().starts_with("incident " + std::to_string(number) + ":"))
            << e;
      }
    }
  }
  EXPECT_EQ(traced, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(rejoined, (std::vector<int64_t>{2}));
  const json run = read_run(dir.path());
  std::vector<int64_t> reported;
  for (const json& i : run.at("incidents")) reported.push_back(i.at("number"));
  EXPECT_EQ(reported, traced);
  // The page's "#" column is that number, not the row's.
  EXPECT_NE(report_html(run, "").find("['#', i => i.number]"), std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag

// The run's incidents marked in its trace (diag/trace_incidents.h), from a
// hand-written trace and incidents.jsonl: an incident detected before the
// trace's zero moves zero back (the steps move with it), its restart span
// runs to the recovery, a straggler episode is a span on its rank's process
// from named to recovered, one after the trace is left out, marking twice
// gives the same file, and a trace without its wall-clock zero is refused.
// The whole path from an injected fault runs in tests/cli/trace_incidents_test.cc.
#include "brigade/diag/trace_incidents.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
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
  return {{"traceEvents", events}, {"otherData", {{"origin_unix_us", kOrigin}}}};
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

TEST(TraceIncidents, MarksWhatOverlapsTheTraceOnItsClock) {
  json trace = hand_trace();
  EXPECT_EQ(mark_incidents(trace, hand_records()), 2);
  // Zero moved back to the fault: 60 us.
  EXPECT_EQ(trace.at("otherData").at("origin_unix_us").get<int64_t>(), kOrigin - 60);
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") == "step" && e.at("name") == "step 1") {
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 160.0);
    }
  }
  const std::vector<json> incident = with_category(trace, "incident");
  ASSERT_EQ(incident.size(), 2u);  // detected, and the restart; not incident 4
  for (const json& e : incident) {
    EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 10.0) << e;
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
  EXPECT_DOUBLE_EQ(straggler[0].at("ts").get<double>(), 380.0);
  EXPECT_DOUBLE_EQ(straggler[0].at("dur").get<double>(), 60.0);

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

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag

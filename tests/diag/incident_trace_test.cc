// An incident's timeline (diag/incident_trace.h) from hand-written evidence
// as the agent and the workers write it: two ranks waiting in a collective
// for a third that stopped; the dumps, taken a millisecond apart, line up on
// the wall clock (also when one has milliseconds only); the wait is drawn to
// the dump and marked as the root cause's collective, one queued behind it
// starts where it ends, a send is an async span; the silent rank, the fault
// and the detection are placed; older evidence without the stamps still
// gives a timeline; a timeline that cannot be written is an error. The whole
// path from an injected fault runs in tests/cli/root_cause_test.cc.
#include "brigade/diag/incident_trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "brigade/core/error.h"
#include "brigade/diag/root_cause.h"
#include "testing/temp_dir.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr double kDumpUs = 1.7e15;  // rank 0's dump; rank 2's a millisecond later
constexpr char kGrads[] = "shm all_reduce(count 28032, f32, sum)";

nlohmann::json record(uint64_t seq, double scheduled_ago, double started_ago,
                      nlohmann::json finished_ago) {
  return {{"kind", "collective"},
          {"seq", seq},
          {"op", kGrads},
          {"bytes", 112128},
          {"state", finished_ago.is_null() ? "started" : "completed"},
          {"scheduled_ms_ago", scheduled_ago},
          {"started_ms_ago", started_ago},
          {"finished_ms_ago", finished_ago}};
}

// Incident 4 of a 3-rank job: rank 1 stopped after seq 2; ranks 0 and 2 wait
// in seq 3; rank 0 queued seq 4 behind it and sent to rank 2 (a p2p op
// 2.7 s before its dump, for 50 ms). `stamps`: the views carry the
// wall-clock stamps and rank 2's dump its microseconds (else as written
// before they existed).
void write_hang(const fs::path& dir, bool stamps) {
  fs::create_directories(dir);
  nlohmann::json workers = nlohmann::json::array();
  for (int r = 0; r < 3; ++r) {
    workers.push_back({{"rank", r},
                       {"local_rank", r},
                       {"node", 0},
                       {"pid", 100 + r},
                       {"running", true},
                       {"exit_code", nullptr},
                       {"signal", nullptr},
                       {"dumped", r != 1},
                       {"beat_age_ms", r == 1 ? 2500.0 : 40.0},
                       {"step", 3},
                       {"start_step", 0},
                       {"step_age_ms", 10.0},
                       {"last_step_ms", 5.0}});
  }
  nlohmann::json view = {
      {"incident", 4},
      {"node", 0},
      {"nproc_per_node", 3},
      {"detected",
       {{"rank", 1}, {"what", "worker rank 1 (local 1, node 0) stopped"}, {"kind", "hang"}}},
      {"workers", workers}};
  if (stamps) {
    view["fault_unix_us"] = kDumpUs - 2.5e6;
    view["detected_unix_us"] = kDumpUs - 0.2e6;
  }
  std::ofstream(dir / "agent_node0.json") << view.dump(1);
  for (int r : {0, 2}) {
    // Rank 2 dumps 1 ms later, so every "ago" is 1 ms longer.
    const double late = r == 2 ? 1.0 : 0.0;
    nlohmann::json records = nlohmann::json::array();
    for (uint64_t seq = 0; seq < 3; ++seq) {
      const double at = 3000.0 - 100.0 * static_cast<double>(seq) + late;
      records.push_back(record(seq, at, at, at - 10.0));
    }
    records.push_back(record(3, 2600.0 + late, 2600.0 + late, nullptr));
    if (r == 0) {
      nlohmann::json queued = record(4, 2500.0, 0.0, nullptr);
      queued["state"] = "scheduled";
      queued["started_ms_ago"] = nullptr;
      records.push_back(queued);
      records.push_back({{"kind", "p2p"},
                         {"seq", 0},
                         {"op", "shm send(to 2)"},
                         {"state", "completed"},
                         {"scheduled_ms_ago", 2700.0},
                         {"started_ms_ago", 2700.0},
                         {"finished_ms_ago", 2650.0}});
    }
    nlohmann::json dump = {
        {"world_rank", r},
        {"pid", 100 + r},
        {"group", {{"name", "world"}, {"rank", r}, {"size", 3}, {"members", {0, 1, 2}}}},
        {"dumped_at_unix_ms", static_cast<int64_t>((kDumpUs + late * 1e3) / 1e3)},
        {"records", records}};
    // Rank 0's dump always has the microseconds, rank 2's only with stamps.
    if (stamps || r == 0) dump["dumped_at_unix_us"] = kDumpUs + late * 1e3;
    std::ofstream(dir / ("flight_recorder_rank" + std::to_string(r) + "_world.json"))
        << dump.dump(1);
  }
}

const nlohmann::json* find_event(const nlohmann::json& trace, int pid, const std::string& name) {
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.value("pid", -1) == pid && e.value("name", std::string()) == name) return &e;
  }
  return nullptr;
}

TEST(IncidentTrace, TheWaitIsDrawnOnOneClockWithTheFaultAndTheCause) {
  testing::TempDir run("brigade_incident_trace");
  const fs::path dir = run.path() / "incidents" / "4";
  write_hang(dir, /*stamps=*/true);
  const std::string line = find_root_cause(read_incident(dir)).line;
  ASSERT_NE(line.find("rank 1"), std::string::npos) << line;
  write_incident_trace(dir);
  std::ifstream in(dir / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  EXPECT_EQ(trace.at("otherData").at("cause"), line);
  for (int r = 0; r < 3; ++r) {
    const nlohmann::json* name = find_event(trace, r + 1, "process_name");
    ASSERT_NE(name, nullptr) << "rank " << r;
    EXPECT_EQ(name->at("args").at("name"), "rank " + std::to_string(r) + " (node 0)");
  }
  // Zero is rank 0's first call, 3 s before its dump.
  const std::string first = std::string(kGrads) + " #0";
  for (int pid : {1, 3}) {
    const nlohmann::json* e = find_event(trace, pid, first);
    ASSERT_NE(e, nullptr) << trace.dump(1);
    EXPECT_DOUBLE_EQ(e->at("ts").get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(e->at("dur").get<double>(), 10'000.0);
    // The wait: from the call, 2.6 s before each rank's own dump, to that
    // dump; both ranks' waits begin at the same moment.
    const nlohmann::json* wait =
        find_event(trace, pid, std::string(kGrads) + " #3 (never completed)");
    ASSERT_NE(wait, nullptr) << trace.dump(1);
    EXPECT_DOUBLE_EQ(wait->at("ts").get<double>(), 400'000.0);
    EXPECT_DOUBLE_EQ(wait->at("dur").get<double>(), pid == 3 ? 2'601'000.0 : 2'600'000.0);
    EXPECT_EQ(wait->at("args").value("root_cause", std::string()), line);
  }
  // Queued behind the wait, seq 4 starts where it ends (at the dump), its
  // call kept in the args; the send is an async pair.
  const nlohmann::json* queued = find_event(trace, 1, std::string(kGrads) + " #4 (never started)");
  ASSERT_NE(queued, nullptr);
  EXPECT_DOUBLE_EQ(queued->at("ts").get<double>(), 3'000'000.0);
  EXPECT_DOUBLE_EQ(queued->at("args").at("called_us").get<double>(), 500'000.0);
  int p2p = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.value("name", std::string()) != "shm send(to 2) #0") continue;
    ++p2p;
    EXPECT_EQ(e.at("id2").at("local"), "world/p2p/0");
    EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), e.at("ph") == "b" ? 300'000.0 : 350'000.0);
  }
  EXPECT_EQ(p2p, 2);
  // The silent rank has no dump; the line is on it, at the detection.
  EXPECT_NE(find_event(trace, 2, "no flight recorder: it did not answer (stopped or frozen)"),
            nullptr);
  const nlohmann::json* cause = find_event(trace, 2, line);
  ASSERT_NE(cause, nullptr);
  EXPECT_DOUBLE_EQ(cause->at("ts").get<double>(), 2'800'000.0);
  const nlohmann::json* fault =
      find_event(trace, 4, "fault (node 0): worker rank 1 (local 1, node 0) stopped");
  ASSERT_NE(fault, nullptr);
  EXPECT_DOUBLE_EQ(fault->at("ts").get<double>(), 500'000.0);
  const nlohmann::json* detected = find_event(trace, 4, "detected (node 0)");
  ASSERT_NE(detected, nullptr);
  EXPECT_DOUBLE_EQ(detected->at("ts").get<double>(), 2'800'000.0);
  const nlohmann::json* incident = find_event(trace, 4, "process_name");
  ASSERT_NE(incident, nullptr);
  EXPECT_EQ(incident->at("args").at("name"), "incident 4");
}

TEST(IncidentTrace, EvidenceWithoutTheStampsStillGivesATimeline) {
  testing::TempDir run("brigade_incident_trace");
  const fs::path dir = run.path() / "incidents" / "4";
  write_hang(dir, /*stamps=*/false);
  const std::string line = find_root_cause(read_incident(dir)).line;
  write_incident_trace(dir);
  std::ifstream in(dir / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  // Rank 2's dump says milliseconds only: its wait still lines up.
  for (int pid : {1, 3}) {
    const nlohmann::json* wait =
        find_event(trace, pid, std::string(kGrads) + " #3 (never completed)");
    ASSERT_NE(wait, nullptr) << pid;
    EXPECT_DOUBLE_EQ(wait->at("ts").get<double>(), 400'000.0);
  }
  EXPECT_NE(find_event(trace, 4, "detected (time unknown: the dumps' end)"), nullptr);
  EXPECT_NE(find_event(trace, 2, line), nullptr);
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.contains("ts")) {
      EXPECT_GE(e.at("ts").get<double>(), 0.0) << e.dump();
    }
  }
}

TEST(IncidentTrace, ATimelineThatCannotBeWrittenIsAnErrorNamingTheFile) {
  testing::TempDir run("brigade_incident_trace");
  const fs::path dir = run.path() / "incidents" / "4";
  write_hang(dir, /*stamps=*/true);
  fs::create_directory(dir / "trace.json");  // in the way of the file
  try {
    write_incident_trace(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trace.json"), std::string::npos) << e.what();
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag

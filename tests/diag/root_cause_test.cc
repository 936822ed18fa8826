// The root-cause analysis on hand-built evidence: each kind (crash, hang,
// skip, mismatch, a stuck rank) named with its rank, node, step and
// collective; a slow rank never blamed while another sign explains the
// incident; the evidence files read back as the agent writes them; clear
// errors for a directory without evidence. The whole path, from an injected
// fault to the launcher's line, runs in tests/cli/root_cause_test.cc.
#include "brigade/diag/root_cause.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "testing/temp_dir.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr char kStop[] = "shm all_reduce(count 1, f64, max)";
constexpr char kGrads[] = "shm all_reduce(count 28032, f32, sum)";
constexpr char kRss[] = "shm all_gather(count 1 per rank, f64)";

// Four ranks of one node that ran `steps` steps of the loop's three
// collectives on the world group, all completed, each at step `steps`.
IncidentEvidence healthy(int steps) {
  IncidentEvidence e;
  e.number = 3;
  e.detected_what = "worker rank 0 (local 0, node 0) exited with status 1";
  e.detected_rank = 0;
  for (int r = 0; r < 4; ++r) {
    RankEvidence rank;
    rank.rank = r;
    rank.node = 0;
    rank.beat_age_ms = 50;
    rank.step = steps;
    GroupDump world{"world", {0, 1, 2, 3}, {}};
    uint64_t seq = 0;
    for (int s = 0; s < steps; ++s) {
      for (const char* op : {kStop, kGrads, kRss})
        world.collectives.push_back({seq++, op, "completed"});
    }
    rank.groups.push_back(world);
    e.ranks.push_back(rank);
  }
  return e;
}

GroupDump& world(IncidentEvidence& e, int rank) {
  return e.ranks[static_cast<size_t>(rank)].groups[0];
}

// Rank `rank` enters `op` and waits in it.
void waits_in(IncidentEvidence& e, int rank, const char* op, const char* state = "started") {
  GroupDump& g = world(e, rank);
  g.collectives.push_back({g.collectives.back().seq + 1, op, state});
}

TEST(RootCause, ACrashedRankIsNamedWithTheCollectiveTheOthersWaitIn) {
  IncidentEvidence e = healthy(5);
  e.ranks[2].running = false;
  e.ranks[2].signal = 9;
  e.ranks[2].groups.clear();  // killed: no dump
  for (int r : {0, 1, 3}) waits_in(e, r, kStop);
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "crash");
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.seq, 15u);
  EXPECT_EQ(c.waiting, 3);
  EXPECT_EQ(c.line,
            "incident 3: rank 2 (node 0) crashed (killed by SIGKILL) after step 5, before "
            "all_reduce #15 of group world; 3 ranks were waiting for it there");
}

TEST(RootCause, ASilentRankStoppedRespondingAndTheSlowOneIsNotBlamed) {
  IncidentEvidence e = healthy(5);
  // Rank 1 stopped before its step's first collective; rank 3 is slow: also
  // behind, but beating.
  e.ranks[1].beat_age_ms = 2100;
  e.ranks[1].groups.clear();
  e.ranks[3].step = 4;
  world(e, 3).collectives.resize(13);
  for (int r : {0, 2}) waits_in(e, r, kStop);
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "hang");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.line,
            "incident 3: rank 1 (node 0) stopped responding after step 5, before all_reduce #15 "
            "of group world; 2 ranks were waiting for it there");
}

TEST(RootCause, ARankTheKernelHoldsStoppedStoppedRespondingThoughItsBeatIsYoung) {
  IncidentEvidence e = healthy(5);
  // Found stopped (state T) 300 ms after its last beat, before a silence
  // of kSilentBeatMs would prove it; its peers wait in its next collective.
  e.ranks[1].beat_age_ms = 300;
  e.ranks[1].stopped = true;
  e.ranks[1].groups.clear();
  for (int r : {0, 2, 3}) waits_in(e, r, kStop);
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "hang");
  EXPECT_EQ(c.rank, 1);
  EXPECT_NE(c.line.find("rank 1 (node 0) stopped responding"), std::string::npos) << c.line;
}

TEST(RootCause, ASlowRankIsNotBlamedForACrashElsewhere) {
  IncidentEvidence e = healthy(5);
  e.ranks[0].running = false;
  e.ranks[0].exit_code = 1;
  e.detected_rank = 0;
  e.ranks[3].running = false;
  e.ranks[3].signal = 11;
  e.ranks[3].groups.clear();
  e.ranks[1].step = 4;  // slow, behind everyone
  world(e, 1).collectives.resize(12);
  waits_in(e, 2, kStop);
  waits_in(e, 0, kStop, "failed");
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "crash");
  EXPECT_EQ(c.rank, 3) << "a signal of its own outweighs the agent's first exit";
  EXPECT_NE(c.line.find("killed by SIGSEGV"), std::string::npos) << c.line;
}

TEST(RootCause, ACallWithAnotherCountIsAMismatch) {
  IncidentEvidence e = healthy(5);
  for (int r : {0, 1, 2}) waits_in(e, r, kStop, "failed");
  waits_in(e, 3, "shm all_reduce(count 2, f64, max)", "failed");
  for (auto& r : e.ranks) {
    r.running = false;
    r.exit_code = 1;
  }
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "mismatch");
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.seq, 15u);
  EXPECT_EQ(c.line,
            "incident 3: rank 3 (node 0) called all_reduce #15 of group world with another shape "
            "after step 5 (a mismatch): all_reduce(count 2, f64, max) where 3 ranks called "
            "all_reduce(count 1, f64, max)");
}

// Another kind of collective where the others wait is a skip even when the
// history has never shown the two in a row (a skip after the first step).
TEST(RootCause, AnotherKindOfCollectiveWithNoHistoryIsASkipNotAMismatch) {
  IncidentEvidence e = healthy(5);
  for (int r : {0, 1, 2}) waits_in(e, r, kStop, "failed");
  waits_in(e, 3, "shm all_gather(count 15 per rank, f64)", "failed");
  for (auto& r : e.ranks) {
    r.running = false;
    r.exit_code = 1;
  }
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "skip") << c.line;
  EXPECT_EQ(c.rank, 3);
}

TEST(RootCause, RunningTheGroupsNextCollectiveInsteadIsASkip) {
  IncidentEvidence e = healthy(5);
  for (int r : {0, 2, 3}) waits_in(e, r, kStop, "failed");
  waits_in(e, 1, kGrads, "failed");
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "skip");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.line,
            "incident 3: rank 1 (node 0) skipped all_reduce #15 of group world after step 5: it "
            "ran the group's next collective, all_reduce(count 28032, f32, sum), in its place; 3 "
            "ranks ran all_reduce(count 1, f64, max)");
}

TEST(RootCause, WithTwoRanksTheHistoryTellsWhichOneSkipped) {
  IncidentEvidence e = healthy(5);
  e.ranks.resize(2);
  for (auto& r : e.ranks) r.groups[0].members = {0, 1};
  waits_in(e, 0, kGrads, "failed");
  waits_in(e, 1, kStop, "failed");
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "skip");
  EXPECT_EQ(c.rank, 0);
}

TEST(RootCause, ARankBehindThatMovedOnSkippedAndOneThatDidNotIsStuck) {
  IncidentEvidence e = healthy(5);
  for (int r : {0, 1, 3}) waits_in(e, r, kStop);
  // Rank 2 never entered #15 and waits in another group's collective.
  e.ranks[2].groups.push_back({"tp0", {2, 3}, {{0, kRss, "started"}}});
  RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "skip");
  EXPECT_EQ(c.rank, 2);
  EXPECT_NE(c.line.find("skipped all_reduce #15 of group world after step 5 and went on; 3 ranks "
                        "were waiting for it there"),
            std::string::npos)
      << c.line;
  e.ranks[2].groups.pop_back();
  c = find_root_cause(e);
  EXPECT_EQ(c.kind, "hang");
  EXPECT_EQ(c.rank, 2);
  EXPECT_NE(c.line.find("stopped making progress after step 5, before all_reduce #15"),
            std::string::npos)
      << c.line;
}

TEST(RootCause, NoSignIsSaidAsSuch) {
  const RootCause c = find_root_cause(healthy(2));
  EXPECT_EQ(c.kind, "unknown");
  EXPECT_EQ(c.line,
            "incident 3: no root cause in the evidence; the agent saw: worker rank 0 (local 0, "
            "node 0) exited with status 1");
}

// The files, as elastic/incident_evidence.h and comm/flight_recorder.h write them.
// Each node's agent writes its own view of its workers.
void write_evidence(const fs::path& dir, const IncidentEvidence& e, int nproc_per_node = 4) {
  fs::create_directories(dir);
  std::map<int, nlohmann::json> workers;
  for (const RankEvidence& r : e.ranks) {
    if (!workers.contains(r.node)) workers[r.node] = nlohmann::json::array();
    workers[r.node].push_back({{"rank", r.rank},
                               {"local_rank", r.rank},
                               {"node", r.node},
                               {"pid", 100 + r.rank},
                               {"running", r.running},
                               {"exit_code", r.exit_code ? nlohmann::json(*r.exit_code) : nullptr},
                               {"signal", r.signal ? nlohmann::json(*r.signal) : nullptr},
                               {"dumped", !r.groups.empty()},
                               {"beat_age_ms", *r.beat_age_ms},
                               {"step", r.step},
                               {"start_step", 0},
                               {"step_age_ms", 10.0},
                               {"last_step_ms", 5.0}});
    for (const GroupDump& g : r.groups) {
      nlohmann::json records = nlohmann::json::array();
      for (const CollectiveRecord& c : g.collectives) {
        records.push_back(
            {{"kind", "collective"}, {"seq", c.seq}, {"op", c.op}, {"state", c.state}});
      }
      records.push_back({{"kind", "p2p"}, {"seq", 0}, {"op", "shm send"}, {"state", "started"}});
      std::ofstream(dir /
                    ("flight_recorder_rank" + std::to_string(r.rank) + "_" + g.name + ".json"))
          << nlohmann::json{{"world_rank", r.rank},
                            {"pid", 100 + r.rank},
                            {"group",
                             {{"name", g.name},
                              {"rank", r.rank},
                              {"size", 4},
                              {"members", g.members}}},
                            {"records", records}}
                 .dump(1);
    }
  }
  for (const auto& [node, list] : workers) {
    std::ofstream(dir / ("agent_node" + std::to_string(node) + ".json")) << nlohmann::json{
        {"incident", e.number},
        {"node", node},
        {"nproc_per_node", nproc_per_node},
        {"detected", {{"rank", e.detected_rank}, {"what", e.detected_what}, {"kind", "crash"}}},
        {"workers", list}}.dump(1);
  }
}

TEST(RootCause, TheEvidenceFilesReadBackToTheSameCause) {
  testing::TempDir run("brigade_root_cause");
  IncidentEvidence e = healthy(5);
  e.ranks[2].beat_age_ms = 2500;
  e.ranks[2].groups.clear();
  for (int r : {0, 1, 3}) waits_in(e, r, kStop);
  write_evidence(run.path() / "incidents" / "3", e);
  const auto dirs = incident_dirs(run.path());
  ASSERT_EQ(dirs.size(), 1u);
  const IncidentEvidence read = read_incident(dirs[0]);
  EXPECT_EQ(read.ranks.size(), 4u);
  EXPECT_EQ(read.ranks[0].groups.at(0).collectives.size(), 16u)
      << "p2p records are not collectives";
  const RootCause expected = find_root_cause(e);
  EXPECT_EQ(find_root_cause(read).line, expected.line);
  EXPECT_EQ(diagnose_incident(dirs[0]), expected.line);
  std::ifstream cause(dirs[0] / "cause.txt");
  std::string line;
  std::getline(cause, line);
  EXPECT_EQ(line, expected.line);
}

TEST(RootCause, EveryNodesViewIsRead) {
  // Two nodes of two ranks sharing the run directory: rank 2 on node 1
  // crashed, which only node 1's agent saw.
  testing::TempDir run("brigade_root_cause");
  IncidentEvidence e = healthy(5);
  for (RankEvidence& r : e.ranks) r.node = r.rank / 2;
  e.ranks[2].running = false;
  e.ranks[2].signal = 9;
  e.ranks[2].groups.clear();
  for (int r : {0, 1, 3}) waits_in(e, r, kStop);
  write_evidence(run.path() / "incidents" / "2", e, /*nproc_per_node=*/2);
  const IncidentEvidence read = read_incident(run.path() / "incidents" / "2");
  ASSERT_EQ(read.ranks.size(), 4u);
  const auto culprit = std::find_if(read.ranks.begin(), read.ranks.end(),
                                    [](const RankEvidence& r) { return r.rank == 2; });
  ASSERT_NE(culprit, read.ranks.end());
  EXPECT_EQ(culprit->node, 1);
  EXPECT_EQ(culprit->signal, 9);
  EXPECT_FALSE(culprit->running);
  const RootCause cause = find_root_cause(read);
  EXPECT_EQ(cause.rank, 2);
  EXPECT_EQ(cause.node, 1);
  EXPECT_EQ(cause.kind, "crash");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// What every rank of a dp group of `hashes.size()` (world ranks 0..n-1)
// reports after a failed replica check at `step`.
CorruptionReport corruption_report(const std::vector<std::string>& hashes,
                                   const std::vector<int>& suspects, int64_t step) {
  CorruptionReport r;
  r.step = step;
  r.group = "world";
  r.compared = "parameters (28032 floats)";
  r.hashes = hashes;
  for (int i = 0; i < static_cast<int>(hashes.size()); ++i) r.members.push_back(i);
  r.suspects = suspects;
  return r;
}

// The ranks exit on purpose once they found it: the report explains the exits.
TEST(RootCause, SilentCorruptionNamesTheOddReplicaAndTheStep) {
  IncidentEvidence e = healthy(6);
  for (RankEvidence& r : e.ranks) r.node = r.rank / 2;
  for (int r : {0, 1}) {
    e.ranks[static_cast<size_t>(r)].running = false;
    e.ranks[static_cast<size_t>(r)].exit_code = 1;
  }
  e.corruption.push_back(corruption_report({"aa", "aa", "aa", "bb"}, {3}, 6));
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "sdc");
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.node, 1);
  EXPECT_EQ(c.step, 6);
  EXPECT_EQ(c.line,
            "incident 3: rank 3 (node 1): silent data corruption after step 6: its parameters "
            "(28032 floats) differ from those of the 3 other replicas of group world (hash bb "
            "against aa)");
}

TEST(RootCause, WithTwoReplicasSilentCorruptionNamesBothAndSaysWhy) {
  IncidentEvidence e = healthy(4);
  e.ranks.resize(2);
  e.corruption.push_back(corruption_report({"aa", "bb"}, {0, 1}, 4));
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "sdc");
  EXPECT_EQ(c.suspects, (std::vector<int>{0, 1}));
  EXPECT_NE(c.line.find("incident 3: ranks 0 (node 0) and 1 (node 0): silent data corruption "
                        "after step 4"),
            std::string::npos)
      << c.line;
  EXPECT_NE(c.line.find("no majority"), std::string::npos) << c.line;
  EXPECT_NE(c.line.find("aa on rank 0, bb on rank 1"), std::string::npos) << c.line;
}

// ZeRO 3's own-slice check and the gradient replay compare no replicas:
// their finding is the worker's, printed as is after the named rank.
TEST(RootCause, ACheckThatComparesNoReplicasIsQuotedInItsOwnWords) {
  IncidentEvidence e = healthy(4);
  e.ranks.resize(2);
  CorruptionReport r = corruption_report({"aa", "bb"}, {1}, 7);
  r.finding = "rank 1's local gradient of step 8 (before the reduce) is off";
  e.corruption.push_back(r);
  const RootCause c = find_root_cause(e);
  EXPECT_EQ(c.kind, "sdc");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.line,
            "incident 3: rank 1 (node 0): silent data corruption after step 7: rank 1's local "
            "gradient of step 8 (before the reduce) is off");
}

TEST(RootCause, TheCorruptionReportReadsBackFromTheIncidentsDirectory) {
  testing::TempDir run("brigade_root_cause");
  IncidentEvidence e = healthy(5);
  const fs::path dir = run.path() / "incidents" / "3";
  write_evidence(dir, e);
  std::ofstream(dir / "sdc_rank0_step5.json")
      << nlohmann::json{{"kind", "silent_data_corruption"},
                        {"world_rank", 0},
                        {"pid", 1},
                        {"step", 5},
                        {"group", "world"},
                        {"members", {0, 1, 2, 3}},
                        {"compared", "parameters (28032 floats)"},
                        {"hashes", {"aa", "cc", "aa", "aa"}},
                        {"suspects", {1}},
                        {"finding", "its own slices changed"}};
  const RootCause c = find_root_cause(read_incident(dir));
  EXPECT_EQ(c.kind, "sdc");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.step, 5);
  EXPECT_NE(c.line.find("after step 5: its own slices changed"), std::string::npos) << c.line;
  std::ofstream(dir / "sdc_rank2_step5.json") << R"({"world_rank": 2})";
  EXPECT_NE(error_of([&] { read_incident(dir); }).find("not a replica check's report"),
            std::string::npos);
}

TEST(RootCause, ADirectoryWithoutEvidenceIsAClearError) {
  testing::TempDir run("brigade_root_cause");
  EXPECT_NE(error_of([&] { incident_dirs(run.path() / "nope"); }).find("is not a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { incident_dirs(run.path()); }).find("holds no incident evidence"),
            std::string::npos);
  fs::create_directories(run.path() / "incidents" / "1");
  EXPECT_NE(error_of([&] {
              read_incident(run.path() / "incidents" / "1");
            }).find("has no agent_node<k>.json"),
            std::string::npos);
  std::ofstream(run.path() / "incidents" / "1" / "agent_node0.json") << "{\"incident\": 1}";
  EXPECT_NE(error_of([&] {
              read_incident(run.path() / "incidents" / "1");
            }).find("lacks what the agent writes"),
            std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag

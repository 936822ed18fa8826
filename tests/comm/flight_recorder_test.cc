#include "brigade/comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/error.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// BRIGADE_FLIGHT_RECORDER_DIR for one scope of this (single-threaded) test.
class RunDirEnvironment {
 public:
  explicit RunDirEnvironment(const fs::path& dir) {
    ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  }
  ~RunDirEnvironment() { ::unsetenv("BRIGADE_FLIGHT_RECORDER_DIR"); }
  RunDirEnvironment(const RunDirEnvironment&) = delete;
  RunDirEnvironment& operator=(const RunDirEnvironment&) = delete;
};

TEST(FlightRecorder, KeepsTheLastRecordsWithTheirStates) {
  FlightRecorder recorder(3);
  const auto dp = recorder.add_group({"dp", 1, 2, {4, 5}});
  const auto tp = recorder.add_group({"tp", 0, 2, {5, 7}});
  const uint64_t a = recorder.scheduled(dp, RecordKind::kCollective, 0, "shm", "all_reduce", 64);
  const uint64_t b = recorder.scheduled(dp, RecordKind::kCollective, 1, "shm", "all_reduce", 64);
  const uint64_t c = recorder.scheduled(tp, RecordKind::kCollective, 0, "shm", "all_gather", 32);
  const uint64_t d = recorder.scheduled(dp, RecordKind::kCollective, 2, "shm", "barrier", 0);
  recorder.started(b);
  recorder.completed(b);
  recorder.started(c);
  recorder.failed(d, "peer rank 3 had not arrived");
  recorder.completed(a);  // already overwritten by d: ignored
  const nlohmann::json j = recorder.to_json(dp);
  EXPECT_EQ(j["world_rank"], 5);
  EXPECT_EQ(j["group"]["name"], "dp");
  EXPECT_EQ(j["group"]["rank"], 1);
  EXPECT_EQ(j["group"]["size"], 2);
  EXPECT_EQ(j["group"]["members"], (std::vector<int>{4, 5}));
  ASSERT_EQ(j["records"].size(), 2u);    // a is gone, c is tp's
  EXPECT_EQ(j["records"][0]["seq"], 1);  // oldest first
  EXPECT_EQ(j["records"][0]["op"], "shm all_reduce");
  EXPECT_EQ(j["records"][0]["state"], "completed");
  EXPECT_EQ(j["records"][1]["state"], "failed");
  EXPECT_EQ(j["records"][1]["error"], "peer rank 3 had not arrived");
  const nlohmann::json t = recorder.to_json(tp);
  EXPECT_EQ(t["world_rank"], 5);
  ASSERT_EQ(t["records"].size(), 1u);
  EXPECT_EQ(t["records"][0]["group"], "tp");
  EXPECT_EQ(t["records"][0]["state"], "started");
  EXPECT_TRUE(t["records"][0]["finished_ms_ago"].is_null());
}

// Collectives and sends/recvs are numbered separately, so the same sequence
// number appears in both kinds: the key tells them apart.
TEST(FlightRecorder, KeysAreUniqueAcrossCollectivesAndPointToPoint) {
  FlightRecorder recorder;
  const auto g = recorder.add_group({"world.node1", 0, 2, {2, 3}});
  for (uint64_t seq = 0; seq < 3; ++seq) {
    recorder.scheduled(g, RecordKind::kCollective, seq, "shm", "barrier", 0);
    recorder.scheduled(g, RecordKind::kPointToPoint, seq, "shm", "send(count 1, f32)", 4);
  }
  const nlohmann::json j = recorder.to_json(g);
  ASSERT_EQ(j["records"].size(), 6u);
  std::set<std::string> keys;
  for (const auto& r : j["records"]) keys.insert(r["key"].get<std::string>());
  EXPECT_EQ(keys.size(), 6u);
  EXPECT_EQ(j["records"][0]["key"], "world.node1/collective/0");
  EXPECT_EQ(j["records"][1]["key"], "world.node1/p2p/0");
  EXPECT_EQ(j["records"][1]["kind"], "p2p");
}

TEST(FlightRecorder, GroupMembersAreCheckedAndDefaultToTheWorldsNumbering) {
  EXPECT_EQ(group_members("shm", "world", 3, {}), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(group_members("shm", "dp1", 2, {1, 3}), (std::vector<int>{1, 3}));
  auto message = [](std::vector<int> ranks) {
    try {
      group_members("gloo", "tp0", 2, std::move(ranks));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 1, 2}).find("lists 3 ranks for a group of size 2"), std::string::npos)
      << message({0, 1, 2});
  EXPECT_NE(message({4, 4}).find("twice the world rank 4"), std::string::npos) << message({4, 4});
  EXPECT_NE(message({-1, 0}).find("gloo group 'tp0'"), std::string::npos) << message({-1, 0});
}

// One file per group, named by world rank and group; a closed group only
// while it still has records; a re-created group takes over its file.
TEST(FlightRecorder, DumpWritesOneFilePerGroupNamedByWorldRank) {
  testing::TempDir dir("brigade_flight_recorder_groups");
  FlightRecorder recorder;
  const auto node = recorder.add_group({"world.node1", 1, 2, {2, 3}});
  const auto leaders = recorder.add_group({"world/leaders", 1, 2, {0, 3}});  // '/' -> '_'
  recorder.add_group({"idle", 0, 1, {3}});  // open, no records yet: written empty
  const auto gone = recorder.add_group({"gone", 0, 1, {3}});
  const auto old_dp = recorder.add_group({"dp", 0, 2, {3, 4}});
  recorder.scheduled(node, RecordKind::kCollective, 0, "shm", "barrier", 0);
  recorder.scheduled(leaders, RecordKind::kCollective, 0, "gloo", "barrier", 0);
  recorder.scheduled(old_dp, RecordKind::kCollective, 0, "shm", "old barrier", 0);
  recorder.close_group(gone);  // no records: nothing to write
  recorder.close_group(old_dp);
  const auto new_dp = recorder.add_group({"dp", 0, 2, {3, 4}});
  recorder.scheduled(new_dp, RecordKind::kCollective, 0, "shm", "new barrier", 0);

  EXPECT_EQ(recorder.file_name(node), "flight_recorder_rank3_world.node1.json");
  std::vector<fs::path> written;
  {
    RunDirEnvironment env(dir.path());
    written = recorder.dump_to_run_dir();
  }
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.insert(entry.path().filename().string());
  }
  EXPECT_EQ(names, (std::set<std::string>{"flight_recorder_rank3_world.node1.json",
                                          "flight_recorder_rank3_world_leaders.json",
                                          "flight_recorder_rank3_idle.json",
                                          "flight_recorder_rank3_dp.json"}));
  EXPECT_EQ(written.size(), 4u);
  const nlohmann::json dp = read_json(dir.path() / "flight_recorder_rank3_dp.json");
  ASSERT_EQ(dp["records"].size(), 1u);
  EXPECT_EQ(dp["records"][0]["op"], "shm new barrier");
  const nlohmann::json leaders_dump =
      read_json(dir.path() / "flight_recorder_rank3_world_leaders.json");
  EXPECT_EQ(leaders_dump["group"]["name"], "world/leaders");
  EXPECT_EQ(leaders_dump["group"]["members"], (std::vector<int>{0, 3}));
  EXPECT_TRUE(read_json(dir.path() / "flight_recorder_rank3_idle.json")["records"].empty());
  // Without the variable nothing is written.
  EXPECT_TRUE(recorder.dump_to_run_dir().empty());
}

// Rank 1 leaves after the first all-reduce; rank 0's second one fails, and
// its dump shows the completed operation and the failed one, with the error.
TEST(FlightRecorder, ShmErrorDumpsToTheRunDirectory) {
  testing::TempDir dir("brigade_flight_recorder");
  const std::string name = "/brigade-fr-test-" + std::to_string(::getpid());
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", dir.path().c_str(), 1);
    ShmCommunicatorOptions o;
    o.segment_name = name;
    o.group_name = "world";
    o.rank = rank;
    o.size = 2;
    o.timeout_ms = 20'000;  // the failure is rank 1's exit, noticed long before this
    o.slot_bytes = 4096;
    o.world_ranks = {6, 9};
    ShmCommunicator comm(o);
    float x[4] = {1, 2, 3, 4};
    comm.all_reduce(x, 4, DType::kF32, ReduceOp::kSum)->wait();
    if (rank == 0) comm.all_reduce(x, 4, DType::kF32, ReduceOp::kSum)->wait();
  });
  // Rank 1 first: until it is reaped it is a zombie, which rank 0 cannot
  // tell from a live peer.
  const auto deadline = testing::Clock::now() + std::chrono::seconds(30);
  EXPECT_EQ(testing::reap(pids[1], deadline), 0);
  EXPECT_EQ(testing::reap(pids[0], deadline), 1) << "rank 0's second all-reduce should have failed";

  const fs::path dump = dir.path() / "flight_recorder_rank6_world.json";
  ASSERT_TRUE(fs::exists(dump)) << "no dump written";
  const nlohmann::json j = read_json(dump);
  EXPECT_EQ(j["world_rank"], 6);
  EXPECT_EQ(j["group"]["rank"], 0);
  EXPECT_EQ(j["group"]["members"], (std::vector<int>{6, 9}));
  ASSERT_EQ(j["records"].size(), 2u);
  EXPECT_EQ(j["records"][0]["state"], "completed");
  EXPECT_EQ(j["records"][1]["state"], "failed");
  EXPECT_EQ(j["records"][1]["seq"], 1);
  EXPECT_EQ(j["records"][1]["key"], "world/collective/1");
  EXPECT_NE(j["records"][1]["error"].get<std::string>().find("rank 1"), std::string::npos)
      << j["records"][1]["error"];
}

TEST(FlightRecorder, SignalDumpsToTheRunDirectory) {
  testing::TempDir dir("brigade_flight_recorder_signal");
  const fs::path dump = dir.path() / "flight_recorder_rank3_dp.json";
  const auto pids = testing::fork_ranks(1, [&](int) {
    ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", dir.path().c_str(), 1);
    FlightRecorder& recorder = FlightRecorder::global();
    const auto dp = recorder.add_group({"dp", 1, 2, {1, 3}});
    recorder.scheduled(dp, RecordKind::kCollective, 0, "shm", "all_reduce(count 4, f32, sum)", 16);
    dump_flight_recorder_on_signal(SIGUSR1, 3);
    ::raise(SIGUSR1);
    // The watcher thread writes it: wait for the file (the parent's reap
    // bounds this loop).
    while (!fs::exists(dump)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  ASSERT_EQ(testing::reap_all(pids, std::chrono::seconds(30))[0], 0) << "no dump after SIGUSR1";
  const nlohmann::json j = read_json(dump);
  EXPECT_EQ(j["world_rank"], 3);
  EXPECT_EQ(j["group"]["name"], "dp");
  ASSERT_GE(j["records"].size(), 1u);
  EXPECT_EQ(j["records"].back()["state"], "scheduled");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

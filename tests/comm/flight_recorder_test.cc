#include "brigade/comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/error.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace {
namespace fs = std::filesystem;

TEST(FlightRecorder, KeepsTheLastRecordsWithTheirStates) {
  FlightRecorder recorder(3);
  const uint64_t a = recorder.scheduled("dp", 0, "all_reduce", 64);
  const uint64_t b = recorder.scheduled("dp", 1, "all_reduce", 64);
  const uint64_t c = recorder.scheduled("tp", 0, "all_gather", 32);
  const uint64_t d = recorder.scheduled("dp", 2, "barrier", 0);  // overwrites a
  recorder.started(b);
  recorder.completed(b);
  recorder.started(c);
  recorder.failed(d, "peer rank 3 had not arrived");
  recorder.completed(a);  // already overwritten: ignored
  const nlohmann::json j = recorder.to_json(5);
  EXPECT_EQ(j["rank"], 5);
  ASSERT_EQ(j["records"].size(), 3u);
  EXPECT_EQ(j["records"][0]["seq"], 1);  // oldest first
  EXPECT_EQ(j["records"][0]["state"], "completed");
  EXPECT_EQ(j["records"][1]["group"], "tp");
  EXPECT_EQ(j["records"][1]["state"], "started");
  EXPECT_TRUE(j["records"][1]["finished_ms_ago"].is_null());
  EXPECT_EQ(j["records"][2]["state"], "failed");
  EXPECT_EQ(j["records"][2]["error"], "peer rank 3 had not arrived");
}

// Rank 1 leaves after the first all-reduce; rank 0's second one fails, and
// its dump shows the completed operation and the failed one, with the error.
TEST(FlightRecorder, ShmErrorDumpsToTheRunDirectory) {
  testing::TempDir dir("brigade_flight_recorder");
  ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", dir.path().c_str(), 1);
  const std::string name = "/brigade-fr-test-" + std::to_string(::getpid());
  std::fflush(nullptr);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = ::fork();
    if (pids[rank] == 0) {
      int status = 0;
      try {
        ShmCommunicatorOptions o;
        o.segment_name = name;
        o.group_name = "world";
        o.rank = rank;
        o.size = 2;
        o.timeout_ms = 3000;
        o.slot_bytes = 4096;
        ShmCommunicator comm(o);
        float x[4] = {1, 2, 3, 4};
        comm.all_reduce(x, 4, DType::kF32, ReduceOp::kSum)->wait();
        if (rank == 0) comm.all_reduce(x, 4, DType::kF32, ReduceOp::kSum)->wait();
      } catch (const std::exception& e) {
        status = 1;
      }
      ::_exit(status);
    }
  }
  int status = 0;
  ::waitpid(pids[1], &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ::waitpid(pids[0], &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 1) << "rank 0's second all-reduce should have failed";
  ::unsetenv("BRIGADE_FLIGHT_RECORDER_DIR");

  std::ifstream in(dir.path() / "flight_recorder_rank0.json");
  ASSERT_TRUE(in) << "no dump written";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rank"], 0);
  ASSERT_EQ(j["records"].size(), 2u);
  EXPECT_EQ(j["records"][0]["state"], "completed");
  EXPECT_EQ(j["records"][1]["state"], "failed");
  EXPECT_EQ(j["records"][1]["seq"], 1);
  EXPECT_NE(j["records"][1]["error"].get<std::string>().find("rank 1"), std::string::npos)
      << j["records"][1]["error"];
}

TEST(FlightRecorder, SignalDumpsToTheRunDirectory) {
  testing::TempDir dir("brigade_flight_recorder_signal");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", dir.path().c_str(), 1);
    FlightRecorder::global().scheduled("dp", 0, "all_reduce(count 4, f32, sum)", 16);
    dump_flight_recorder_on_signal(SIGUSR1, 3);
    ::raise(SIGUSR1);
    const fs::path dump = dir.path() / "flight_recorder_rank3.json";
    for (int i = 0; i < 100 && !fs::exists(dump); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::_exit(fs::exists(dump) ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0) << "no dump within 2 s of SIGUSR1";
  std::ifstream in(dir.path() / "flight_recorder_rank3.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rank"], 3);
  ASSERT_GE(j["records"].size(), 1u);
  EXPECT_EQ(j["records"].back()["state"], "scheduled");
}

}  // namespace
}  // namespace brigade

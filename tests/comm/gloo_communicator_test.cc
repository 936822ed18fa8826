// The Gloo communicator: every collective in 2, 3 and 4 forked processes that
// meet through a TcpStoreServer run by the test, checked element by element;
// async operations in flight; two groups sharing one store; and the failure
// cases: a rank that never joins, a stopped peer and a killed peer must turn
// into CommErrors naming them, never into a hang. Every process a test forks
// is reaped (and killed if need be) before the test ends.
#include "brigade/comm/gloo_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "brigade/comm/tcp_store.h"
#include "testing/collective_checks.h"
#include "testing/forked_ranks.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using testing::Clock;
using testing::ms_since;
using testing::require;

constexpr char kToken[] = "gloo-test-token";
constexpr char kServerHost[] = "127.0.0.1";
// How long a rank may take, or a signal between processes may be awaited,
// before it counts as hung: far beyond what any test here needs on a loaded
// machine; only a hang ever waits it out.
constexpr auto kHangLimit = std::chrono::seconds(60);
// What a failing operation may take beyond its timeout: the blame round
// (kBlameGraceMs) and thread wake-ups, which a loaded machine delays.
constexpr int64_t kLateMs = 5000;

GlooCommunicatorOptions make_options(uint16_t port, int rank, int size, int64_t timeout_ms,
                                     const std::string& group = "test") {
  GlooCommunicatorOptions options;
  options.store_host = "127.0.0.1";
  options.store_port = port;
  options.store_token = kToken;
  options.group_name = group;
  options.rank = rank;
  options.size = size;
  options.timeout_ms = timeout_ms;
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(GlooCommunicator, RejectsBadOptions) {
  EXPECT_THROW(GlooCommunicator(make_options(1, 2, 2, 100)), Error);
  EXPECT_THROW(GlooCommunicator(make_options(1, 0, 1, 0)), Error);
  EXPECT_THROW(GlooCommunicator(make_options(1, 0, 1, 100, "")), Error);
}

TEST(GlooCommunicator, RendezvousTimeoutNamesRanksThatNeverJoined) {
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto start = Clock::now();
  try {
    GlooCommunicator comm(make_options(server.port(), 0, 3, 300));
    FAIL() << "a group of 3 formed with one rank";
  } catch (const CommError& e) {
    EXPECT_GE(ms_since(start), 290);
    EXPECT_EQ(e.peer_ranks(), (std::vector<int>{1, 2}));
    EXPECT_TRUE(contains(e.what(), "rank(s) 1, 2 did not join")) << e.what();
    EXPECT_TRUE(contains(e.what(), "group 'test'")) << e.what();
  }
}

TEST(GlooCommunicator, SingleRankRunsEveryCollective) {
  TcpStoreServer server("127.0.0.1", 0, kToken);
  // In a child: Gloo's device threads must not exist in the parent that forks
  // the other tests' ranks.
  const auto pids = testing::fork_ranks(1, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, 1, 5000));
    require(comm.rank() == 0 && comm.size() == 1 && comm.group_name() == "test",
            "rank/size/group wrong");
    testing::check_every_collective<float>(comm, DType::kF32);
    testing::check_every_collective<int64_t>(comm, DType::kI64);
  });
  EXPECT_EQ(testing::reap_all(pids, kHangLimit)[0], 0);
}

class GlooCommunicatorRanks : public ::testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorRanks, EveryCollectiveEveryDTypeMatchesElementByElement) {
  const int size = GetParam();
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto start = Clock::now();
  const auto pids = testing::fork_ranks(size, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, size, 5000));
    testing::check_every_collective<float>(comm, DType::kF32);
    testing::check_every_collective<double>(comm, DType::kF64);
    testing::check_every_collective<int32_t>(comm, DType::kI32);
    testing::check_every_collective<int64_t>(comm, DType::kI64);
  });
  const auto codes = testing::reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
  std::printf("[ timing   ] %d ranks: %.0f ms\n", size, ms_since(start));
}

TEST_P(GlooCommunicatorRanks, SendRecvMatchByPeerAndTagWithoutDeadlock) {
  const int size = GetParam();
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto pids = testing::fork_ranks(size, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, size, 5000));
    testing::check_point_to_point<float>(comm, DType::kF32, {0, 1, 1003, 300'000});
    testing::check_point_to_point<int64_t>(comm, DType::kI64, {5, 777});
    testing::check_point_to_point<double>(comm, DType::kF64, {100});
    testing::check_point_to_point<int32_t>(comm, DType::kI32, {100});
  });
  const auto codes = testing::reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCommunicatorRanks, ::testing::Values(2, 3, 4));

TEST(GlooCommunicator, AsyncOperationsCompleteInOrderAndGroupsShareOneStore) {
  constexpr int kSize = 3;
  TcpStoreServer server("127.0.0.1", 0, kToken);
  testing::PipeSignal issued;  // ranks 1 and 2 -> rank 0
  const auto pids = testing::fork_ranks(kSize, [&](int rank) {
    GlooCommunicator world(make_options(server.port(), rank, kSize, 5000, "world"));
    GlooCommunicator side(make_options(server.port(), rank, kSize, 5000, "side"));
    // Rank 0 comes only once the others have issued everything, so nobody's
    // operations can finish before it does.
    if (rank == 0) require(issued.wait(kSize - 1, kHangLimit), "the peers never issued");
    std::vector<float> a(3001);
    for (size_t i = 0; i < a.size(); ++i) a[i] = testing::value_of<float>(rank, i);
    std::vector<int64_t> b(777);
    for (size_t i = 0; i < b.size(); ++i) b[i] = testing::value_of<int64_t>(rank, i);
    std::vector<int32_t> mine(100, rank + 1);
    std::vector<int32_t> gathered(100 * kSize);
    std::vector<double> root_data(50, rank == 2 ? 2.5 : 0.0);
    std::vector<int32_t> on_side(10, rank);

    std::vector<std::shared_ptr<Work>> works = {
        world.all_reduce(a.data(), a.size(), DType::kF32, ReduceOp::kSum),
        side.all_reduce(on_side.data(), on_side.size(), DType::kI32, ReduceOp::kMax),
        world.all_gather(mine.data(), gathered.data(), mine.size(), DType::kI32),
        world.broadcast(root_data.data(), root_data.size(), DType::kF64, 2),
        world.barrier(),
        world.all_reduce(b.data(), b.size(), DType::kI64, ReduceOp::kMax),
    };
    if (rank != 0) {
      require(!works.back()->test(), "the last operation finished before rank 0 came");
      issued.notify();
    }
    for (auto& work : works) {
      work->wait();
      require(work->test(), "test() is false after wait()");
    }
    for (size_t i = 0; i < a.size(); ++i) {
      require(a[i] == testing::expected_reduction<float>(ReduceOp::kSum, kSize, i), "a[{}] = {}", i,
              a[i]);
    }
    for (int32_t v : on_side) require(v == kSize - 1, "side group max gave {}", v);
    for (size_t i = 0; i < gathered.size(); ++i) {
      require(gathered[i] == static_cast<int32_t>(i / 100 + 1), "gathered[{}] = {}", i,
              gathered[i]);
    }
    for (double v : root_data) require(v == 2.5, "broadcast gave {}", v);
    for (size_t i = 0; i < b.size(); ++i) {
      require(b[i] == testing::expected_reduction<int64_t>(ReduceOp::kMax, kSize, i), "b[{}] = {}",
              i, b[i]);
    }
  });
  const auto codes = testing::reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

TEST(GlooCommunicator, StoppedPeerTimesOutNamingIt) {
  constexpr int kSize = 3;
  constexpr int kStopped = 2;
  constexpr int64_t kTimeoutMs = 1000;
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto pids = testing::fork_ranks(kSize, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, kSize, kTimeoutMs));
    std::vector<float> data(1000, 1.0f);
    comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum)->wait();
    if (rank == kStopped) {
      ::raise(SIGSTOP);  // the parent kills it; it never gets here again
      return;
    }
    const auto start = Clock::now();
    try {
      comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum)->wait();
      require(false, "all_reduce with a stopped peer succeeded");
    } catch (const CommError& e) {
      const double elapsed_ms = ms_since(start);
      const std::string message = e.what();
      require(elapsed_ms <= kTimeoutMs + kLateMs, "error after {} ms: {}", elapsed_ms, message);
      // The stopped rank is blamed; a survivor starved past the blame grace
      // (two loaded cores) may be blamed with it.
      const std::vector<int>& blamed = e.peer_ranks();
      require(std::find(blamed.begin(), blamed.end(), kStopped) != blamed.end(),
              "the stopped rank is not blamed: {}", message);
      for (const char* part : {"all_reduce", "group 'test'", "seq 1", "peer rank(s) "}) {
        require(contains(message, part), "'{}' not in: {}", part, message);
      }
    }
    // The group is broken now: later operations fail at once (the message
    // says so; the bound only rules out waiting out a timeout).
    const auto later = Clock::now();
    try {
      comm.barrier()->wait();
      require(false, "barrier on a broken group succeeded");
    } catch (const CommError& e) {
      require(contains(e.what(), "failed earlier"), "{}", e.what());
      require(ms_since(later) < kTimeoutMs, "broken group took {} ms to fail", ms_since(later));
    }
  });
  const auto deadline = Clock::now() + kHangLimit;
  EXPECT_EQ(testing::reap(pids[0], deadline), 0);
  EXPECT_EQ(testing::reap(pids[1], deadline), 0);
  testing::kill_and_reap(pids[kStopped]);
}

TEST(GlooCommunicator, RecvFromStoppedPeerTimesOutNamingIt) {
  constexpr int64_t kTimeoutMs = 1000;
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, 2, kTimeoutMs));
    comm.barrier()->wait();
    if (rank == 1) {
      ::raise(SIGSTOP);
      return;
    }
    std::vector<float> data(100);
    const auto start = Clock::now();
    try {
      comm.recv(data.data(), data.size(), DType::kF32, 1, 4)->wait();
      require(false, "recv from a stopped peer succeeded");
    } catch (const CommError& e) {
      const double elapsed_ms = ms_since(start);
      require(elapsed_ms <= kTimeoutMs + kLateMs, "error after {} ms: {}", elapsed_ms, e.what());
      require(e.peer_ranks() == std::vector<int>{1}, "blamed the wrong ranks: {}", e.what());
      for (const char* part : {"recv", "from rank 1", "tag 4", "group 'test'"}) {
        require(contains(e.what(), part), "'{}' not in: {}", part, e.what());
      }
    }
  });
  EXPECT_EQ(testing::reap(pids[0], Clock::now() + kHangLimit), 0);
  testing::kill_and_reap(pids[1]);
}

TEST(GlooCommunicator, PeerKilledMidCollectiveFailsTheOthers) {
  constexpr int kSize = 3;
  constexpr int kVictim = 1;
  constexpr int64_t kTimeoutMs = 2000;
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const auto pids = testing::fork_ranks(kSize, [&](int rank) {
    GlooCommunicator comm(make_options(server.port(), rank, kSize, kTimeoutMs));
    // Large enough that the kill lands inside a collective most of the time.
    std::vector<float> data(200'000, 1.0f);
    comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kAvg)->wait();
    TcpStore(kServerHost, server.port(), kToken, 5000).set("ready/" + std::to_string(rank), "1");
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < give_up) {
      try {
        comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kAvg)->wait();
      } catch (const CommError& e) {
        // The victim is always blamed; a survivor that noticed the failure
        // later than the blame grace (a starved machine) may be blamed too.
        const std::vector<int>& blamed = e.peer_ranks();
        require(std::find(blamed.begin(), blamed.end(), kVictim) != blamed.end(),
                "the killed rank is not blamed: {}", e.what());
        return;
      }
    }
    require(false, "no error within 30 s");
  });
  // Kill only once the group has formed and is busy (a loaded machine can
  // take longer than any fixed sleep to get there). Whether the kill lands
  // inside a collective or between two, the next wait fails the same way.
  TcpStore parent_store(kServerHost, server.port(), kToken, 60'000);
  EXPECT_NO_THROW(parent_store.wait({"ready/0", "ready/1", "ready/2"}));
  const auto killed_at = Clock::now();
  ::kill(pids[kVictim], SIGKILL);
  EXPECT_EQ(testing::reap(pids[kVictim], Clock::now() + kHangLimit), 128 + SIGKILL);
  const auto deadline = killed_at + std::chrono::milliseconds(kTimeoutMs + kLateMs);
  EXPECT_EQ(testing::reap(pids[0], deadline), 0);
  EXPECT_EQ(testing::reap(pids[2], deadline), 0);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

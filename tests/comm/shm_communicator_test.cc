// The shared-memory communicator: every collective in 2, 3 and 4 forked
// processes (as workers will be), checked element by element against values
// computed locally; async operations in flight; and the failure cases: a
// stopped peer and a killed peer must turn into errors naming them, never
// into a hang. Slots are tiny (4 KiB) so every size goes through many chunks.
#include "brigade/comm/shm_communicator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "testing/collective_checks.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using testing::check_every_collective;
using testing::Clock;
using testing::expected_reduction;
using testing::ms_since;
using testing::PipeSignal;
using testing::reap;
using testing::reap_all;
using testing::require;
using testing::value_of;
constexpr int64_t kTestSlotBytes = 4096;
// Small rings, so large messages stream through them in many pieces.
constexpr int64_t kTestMailboxBytes = 8192;
// How long a rank may take, or a signal between processes may be awaited,
// before it counts as hung: far beyond what any test here needs, even under
// a sanitizer with both cores loaded; only a hang ever waits it out.
constexpr auto kHangLimit = std::chrono::seconds(60);
// What a failing operation may take beyond its timeout (the error's way back
// to the caller: thread wake-ups, which a loaded machine delays).
constexpr int64_t kLateMs = 5000;

ShmCommunicatorOptions make_options(const std::string& name, int rank, int size, int64_t timeout_ms,
                                    int64_t shared_bytes = 0) {
  ShmCommunicatorOptions options;
  options.segment_name = name;
  options.group_name = "test";
  options.rank = rank;
  options.size = size;
  options.timeout_ms = timeout_ms;
  options.slot_bytes = kTestSlotBytes;
  options.shared_bytes = shared_bytes;
  options.mailbox_bytes = kTestMailboxBytes;
  return options;
}

// Forks `size` ranks; each opens the communicator and runs body(comm).
std::vector<pid_t> fork_ranks(int size, int64_t timeout_ms,
                              const std::function<void(ShmCommunicator&)>& body,
                              int64_t shared_bytes = 0) {
  const std::string name = testing::unique_segment_name();
  return testing::fork_ranks(size, [&](int rank) {
    ShmCommunicator comm(make_options(name, rank, size, timeout_ms, shared_bytes));
    body(comm);
  });
}

TEST(ShmCommunicator, RejectsBadOptions) {
  const std::string name = testing::unique_segment_name();
  EXPECT_THROW(ShmCommunicator(make_options(name, 2, 2, 100)), Error);
  EXPECT_THROW(ShmCommunicator(make_options("no-slash", 0, 1, 100)), Error);
  ShmCommunicatorOptions tiny_slots = make_options(name, 0, 4, 100);
  tiny_slots.slot_bytes = 512;
  EXPECT_THROW(ShmCommunicator{tiny_slots}, Error);
  ShmCommunicatorOptions odd_mailbox = make_options(testing::unique_segment_name(), 0, 1, 100);
  odd_mailbox.mailbox_bytes = 5000;
  EXPECT_THROW(ShmCommunicator{odd_mailbox}, Error);
  ShmCommunicator alone(make_options(testing::unique_segment_name(), 0, 1, 100));
  float value = 0;
  EXPECT_THROW(alone.send(&value, 1, DType::kF32, 0, 0), Error);  // no peer but itself
  EXPECT_THROW(alone.recv(&value, 1, DType::kF32, 1, 0), Error);
}

TEST(ShmCommunicator, SingleRankRunsEveryCollectiveInProcess) {
  ShmCommunicator comm(make_options(testing::unique_segment_name(), 0, 1, 1000));
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.group_name(), "test");
  check_every_collective<float>(comm, DType::kF32);
  check_every_collective<int64_t>(comm, DType::kI64);
}

TEST(ShmCommunicator, RendezvousTimeoutNamesRanksThatNeverAttached) {
  const std::string name = testing::unique_segment_name();
  const auto start = Clock::now();
  try {
    ShmCommunicator comm(make_options(name, 0, 3, 200));
    FAIL() << "a group of 3 formed with one rank";
  } catch (const CommError& e) {
    EXPECT_GE(ms_since(start), 190);
    EXPECT_EQ(e.peer_ranks(), (std::vector<int>{1, 2}));
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not attach"), std::string::npos)
        << e.what();
  }
  // The creator removes the name even when the group never formed.
  EXPECT_LT(::shm_open(name.c_str(), O_RDWR, 0), 0);
}

class ShmCommunicatorRanks : public ::testing::TestWithParam<int> {};

TEST_P(ShmCommunicatorRanks, EveryCollectiveEveryDTypeMatchesElementByElement) {
  const int size = GetParam();
  const auto pids = fork_ranks(size, 5000, [](ShmCommunicator& comm) {
    check_every_collective<float>(comm, DType::kF32);
    check_every_collective<double>(comm, DType::kF64);
    check_every_collective<int32_t>(comm, DType::kI32);
    check_every_collective<int64_t>(comm, DType::kI64);
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// Buffers inside the segment take the zero-copy path: each rank reads its
// peers' buffers directly. Ranks use different offsets in their regions, and
// counts larger than a staging slot, so nothing could pass through the slots
// by accident.
TEST_P(ShmCommunicatorRanks, SharedBuffersAreReducedAndGatheredInPlace) {
  const int size = GetParam();
  constexpr int64_t kCount = 3001;  // not a multiple of any size, > one 4 KiB slot
  const auto pids = fork_ranks(
      size, 5000,
      [](ShmCommunicator& comm) {
        const int rank = comm.rank(), size = comm.size();
        float* region = static_cast<float*>(comm.shared_buffer());
        require(region != nullptr, "no shared buffer");
        float* buf = region + 64 * rank;  // a different offset on every rank
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          for (int64_t i = 0; i < kCount; ++i) buf[i] = value_of<float>(rank, i);
          comm.all_reduce(buf, kCount, DType::kF32, op)->wait();
          for (int64_t i = 0; i < kCount; ++i) {
            require(buf[i] == expected_reduction<float>(op, size, i), "all_reduce [{}]", i);
          }
        }
        // reduce_scatter with input in the region, in place (output = my segment).
        for (int64_t i = 0; i < kCount * size; ++i) buf[i] = value_of<float>(rank, i);
        float* mine = buf + rank * kCount;
        comm.reduce_scatter(buf, mine, kCount, DType::kF32, ReduceOp::kSum)->wait();
        for (int64_t i = 0; i < kCount; ++i) {
          require(mine[i] == expected_reduction<float>(ReduceOp::kSum, size, rank * kCount + i),
                  "reduce_scatter [{}]", i);
        }
        // all_gather in place: my segment is already where the output wants it.
        for (int64_t i = 0; i < kCount; ++i) mine[i] = value_of<float>(rank, i);
        comm.all_gather(mine, buf, kCount, DType::kF32)->wait();
        for (int p = 0; p < size; ++p) {
          for (int64_t i = 0; i < kCount; ++i) {
            require(buf[p * kCount + i] == value_of<float>(p, i), "all_gather [{}][{}]", p, i);
          }
        }
      },
      /*shared_bytes=*/64 * 1024);
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// The permissions ("rw-s", "r--s", ...) of the mapping holding `address`,
// from /proc/self/maps; "" if none does.
std::string mapping_permissions(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    char permissions[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, permissions) == 3 && begin <= at &&
        at < end) {
      return permissions;
    }
  }
  return "";
}

// A rank may write its own shared region and only read its peers': the
// zero-copy collectives never write a peer's region, and a read-only view
// is what makes reading a peer's freshly rewritten pages cheap on a
// paravirtualised guest (shm_communicator.cc, protect_peer_regions). The
// regions lie one after another in the segment, rank by rank, so the bytes
// just past rank 0's region are rank 1's and those just before rank 1's
// are rank 0's.
TEST(ShmCommunicator, PeersSharedRegionsAreReadOnlyInEachRank) {
  constexpr int64_t kSharedBytes = 64 * 1024;
  if (::sysconf(_SC_PAGESIZE) != 4096) {
    GTEST_SKIP() << "regions are 4 KiB-aligned; larger pages straddle them and stay writable";
  }
  const auto pids = fork_ranks(
      2, 5000,
      [&](ShmCommunicator& comm) {
        auto* mine = static_cast<std::byte*>(comm.shared_buffer());
        const auto expect = [](const std::byte* at, const char* want, const char* what) {
          const std::string got = mapping_permissions(at);
          require(got == want, "{}: {}", what, got);
        };
        expect(mine, "rw-s", "own region start");
        expect(mine + kSharedBytes - 1, "rw-s", "own region end");
        const std::byte* peer = comm.rank() == 0 ? mine + kSharedBytes : mine - kSharedBytes;
        expect(peer, "r--s", "peer region start");
        expect(peer + kSharedBytes - 1, "r--s", "peer region end");
        // And the collectives that read it still run.
        float* region = reinterpret_cast<float*>(mine);
        for (int i = 0; i < 2048; ++i) region[i] = static_cast<float>(comm.rank() + 1);
        comm.reduce_scatter(region, region + 1024 * comm.rank(), 1024, DType::kF32, ReduceOp::kSum)
            ->wait();
        require(region[1024 * comm.rank()] == 3.0f, "reduce_scatter read {}",
                region[1024 * comm.rank()]);
      },
      kSharedBytes);
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

TEST_P(ShmCommunicatorRanks, SendRecvMatchByPeerAndTagWithoutDeadlock) {
  const int size = GetParam();
  const auto pids = fork_ranks(size, 5000, [](ShmCommunicator& comm) {
    // 30'000 floats is 15 rings' worth: the frames stream in pieces.
    testing::check_point_to_point<float>(comm, DType::kF32, {0, 1, 1003, 30'000});
    testing::check_point_to_point<int64_t>(comm, DType::kI64, {5, 777});
    testing::check_point_to_point<double>(comm, DType::kF64, {100});
    testing::check_point_to_point<int32_t>(comm, DType::kI32, {100});
    // A message parked before its recv is posted: rank 0 sends, everyone
    // syncs, and only then does rank 1 ask for it.
    std::vector<float> data(5000, comm.rank() == 0 ? 2.5f : 0.0f);
    if (comm.rank() == 0) comm.send(data.data(), data.size(), DType::kF32, 1, 9)->wait();
    comm.barrier()->wait();
    if (comm.rank() == 1) {
      comm.recv(data.data(), data.size(), DType::kF32, 0, 9)->wait();
      require(std::all_of(data.begin(), data.end(), [](float v) { return v == 2.5f; }),
              "parked message corrupted");
    }
    comm.barrier()->wait();
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmCommunicatorRanks, ::testing::Values(2, 3, 4));

TEST(ShmCommunicator, AsyncOperationsStayInFlightAndCompleteInOrder) {
  constexpr int kSize = 3;
  PipeSignal issued;  // ranks 1 and 2 -> rank 0
  const auto pids = fork_ranks(kSize, 5000, [&](ShmCommunicator& comm) {
    const int rank = comm.rank();
    // Rank 0 comes only once the others have issued everything, so nobody's
    // operations can finish before it does.
    if (rank == 0) require(issued.wait(kSize - 1, kHangLimit), "the peers never issued");
    std::vector<float> a(3001);
    for (size_t i = 0; i < a.size(); ++i) a[i] = value_of<float>(rank, i);
    std::vector<int64_t> b(777);
    for (size_t i = 0; i < b.size(); ++i) b[i] = value_of<int64_t>(rank, i);
    std::vector<int32_t> mine(100, rank + 1);
    std::vector<int32_t> gathered(100 * kSize);
    std::vector<double> root_data(50, rank == 2 ? 2.5 : 0.0);

    std::vector<std::shared_ptr<Work>> works = {
        comm.all_reduce(a.data(), a.size(), DType::kF32, ReduceOp::kSum),
        comm.all_gather(mine.data(), gathered.data(), mine.size(), DType::kI32),
        comm.broadcast(root_data.data(), root_data.size(), DType::kF64, 2),
        comm.barrier(),
        comm.all_reduce(b.data(), b.size(), DType::kI64, ReduceOp::kMax),
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
      require(a[i] == expected_reduction<float>(ReduceOp::kSum, kSize, i), "a[{}] = {}", i, a[i]);
    }
    for (size_t i = 0; i < gathered.size(); ++i) {
      require(gathered[i] == static_cast<int32_t>(i / 100 + 1), "gathered[{}] = {}", i,
              gathered[i]);
    }
    for (double v : root_data) require(v == 2.5, "broadcast gave {}", v);
    for (size_t i = 0; i < b.size(); ++i) {
      require(b[i] == expected_reduction<int64_t>(ReduceOp::kMax, kSize, i), "b[{}] = {}", i, b[i]);
    }
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// A small all-reduce runs on the caller's thread while the queue is idle, but
// only for a bounded poll: with a late peer the call still returns at once
// (well, within the poll) and the communication thread finishes it, ahead of
// what is issued next.
TEST(ShmCommunicator, SmallAllReduceReturnsWhileAPeerIsLate) {
  constexpr int kSize = 2;
  constexpr int64_t kTimeoutMs = 10'000;
  PipeSignal issued;  // rank 0 -> rank 1
  const auto pids = fork_ranks(kSize, kTimeoutMs, [&](ShmCommunicator& comm) {
    const int rank = comm.rank();
    // Rank 1 joins only once rank 0 has issued both operations.
    if (rank == 1) require(issued.wait(1, kHangLimit), "rank 0 never issued");
    std::vector<float> small(100);
    for (size_t i = 0; i < small.size(); ++i) small[i] = value_of<float>(rank, i);
    std::vector<int32_t> mine(10, rank + 1);
    std::vector<int32_t> gathered(10 * kSize);
    const auto start = Clock::now();
    auto reduced = comm.all_reduce(small.data(), small.size(), DType::kF32, ReduceOp::kSum);
    auto gather = comm.all_gather(mine.data(), gathered.data(), mine.size(), DType::kI32);
    if (rank == 0) {
      // The inline poll takes 1 ms; a call that waited for the absent peer
      // would not return before the operation's timeout.
      require(ms_since(start) < kTimeoutMs / 4, "issuing took {} ms with the peer away",
              ms_since(start));
      require(!reduced->test(), "the all-reduce finished without its peer");
      issued.notify();
    }
    gather->wait();
    require(reduced->test(), "the all-gather finished before the all-reduce issued first");
    for (size_t i = 0; i < small.size(); ++i) {
      require(small[i] == expected_reduction<float>(ReduceOp::kSum, kSize, i), "small[{}] = {}", i,
              small[i]);
    }
    for (size_t i = 0; i < gathered.size(); ++i) {
      require(gathered[i] == static_cast<int32_t>(i / 10 + 1), "gathered[{}] = {}", i, gathered[i]);
    }
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// The case that rules out running small operations to completion on the
// caller's thread: rank 0 issues an all-reduce, then a send that rank 1 waits
// for before it joins the all-reduce. Blocking rank 0 in the all-reduce would
// deadlock; the bounded poll hands it to the thread and the send goes out.
TEST(ShmCommunicator, SmallAllReduceBeforeASendThePeerNeedsDoesNotDeadlock) {
  constexpr int kSize = 2;
  const auto pids = fork_ranks(kSize, 5000, [](ShmCommunicator& comm) {
    const int rank = comm.rank();
    std::vector<float> small(64, static_cast<float>(rank + 1));
    std::vector<int64_t> message(32, rank == 0 ? 42 : 0);
    if (rank == 0) {
      auto reduced = comm.all_reduce(small.data(), small.size(), DType::kF32, ReduceOp::kSum);
      comm.send(message.data(), message.size(), DType::kI64, 1, 7)->wait();
      reduced->wait();
    } else {
      comm.recv(message.data(), message.size(), DType::kI64, 0, 7)->wait();
      for (int64_t v : message) require(v == 42, "received {}", v);
      comm.all_reduce(small.data(), small.size(), DType::kF32, ReduceOp::kSum)->wait();
    }
    for (float v : small) require(v == 3.0f, "all-reduce gave {}", v);
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// Small all-reduces between every other kind of operation, some waited for
// at once and some left in flight, with the ranks taking turns to be late by
// more than the inline poll (so the caller's thread finishes some and the
// communication thread others); every value depends on the round, so a slot
// half reused while a slower peer still reads it shows up as a wrong sum.
TEST(ShmCommunicator, SmallAllReducesInterleavedWithOtherOperationsUnderSkew) {
  constexpr int kSize = 3;
  constexpr int kRounds = 120;
  constexpr int64_t kLarge = 1000;  // floats: above half of the 4 KiB test slot
  const auto pids = fork_ranks(
      kSize, 10000,
      [](ShmCommunicator& comm) {
        const int rank = comm.rank();
        auto value = [](int r, int round, int64_t i) {
          return static_cast<float>((r + 1) * 1000 + round * 7 + i % 13);
        };
        auto sum = [&](int round, int64_t i) {
          float total = 0;
          for (int r = 0; r < kSize; ++r) total += value(r, round, i);
          return total;
        };
        float* large = static_cast<float*>(comm.shared_buffer());  // zero-copy path
        for (int round = 0; round < kRounds; ++round) {
          // Deliberately late, to vary which thread finishes each small
          // all-reduce; any length (or none, on a preempted rank) is correct.
          if (round % 8 == rank) std::this_thread::sleep_for(std::chrono::microseconds(1500));
          const int64_t count = (round * 37) % 300;
          std::vector<float> small(count), max_of(5);
          for (int64_t i = 0; i < count; ++i) small[i] = value(rank, round, i);
          for (int64_t i = 0; i < 5; ++i) max_of[i] = value(rank, round, i);
          for (int64_t i = 0; i < kLarge; ++i) large[i] = value(rank, round, i);
          std::vector<double> root_data(40, rank == round % kSize ? round + 0.5 : -1.0);
          std::vector<int32_t> mine(7, rank * 100 + round), gathered(7 * kSize);

          comm.all_reduce(small.data(), count, DType::kF32, ReduceOp::kSum)->wait();
          std::vector<std::shared_ptr<Work>> in_flight = {
              comm.broadcast(root_data.data(), root_data.size(), DType::kF64, round % kSize),
              comm.all_reduce(max_of.data(), max_of.size(), DType::kF32, ReduceOp::kMax),
              comm.all_reduce(large, kLarge, DType::kF32, ReduceOp::kSum),
              comm.all_gather(mine.data(), gathered.data(), mine.size(), DType::kI32),
          };
          for (auto& work : in_flight) work->wait();

          for (int64_t i = 0; i < count; ++i) {
            require(small[i] == sum(round, i), "round {} small[{}] = {}", round, i, small[i]);
          }
          for (int64_t i = 0; i < 5; ++i) {
            require(max_of[i] == value(kSize - 1, round, i), "round {} max[{}] = {}", round, i,
                    max_of[i]);
          }
          for (int64_t i = 0; i < kLarge; ++i) {
            require(large[i] == sum(round, i), "round {} large[{}] = {}", round, i, large[i]);
          }
          for (double v : root_data) require(v == round + 0.5, "round {} broadcast {}", round, v);
          for (int s = 0; s < kSize; ++s) {
            require(gathered[s * 7] == s * 100 + round, "round {} gathered from {} = {}", round, s,
                    gathered[s * 7]);
          }
        }
      },
      /*shared_bytes=*/4096);
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// With production-sized slots the small path ends at exactly 64 KiB; both
// sides of the boundary, and every reduction there, give the right values.
TEST(ShmCommunicator, SmallPathBoundaryAtSixtyFourKiB) {
  constexpr int kSize = 2;
  const std::string name = testing::unique_segment_name();
  const auto pids = testing::fork_ranks(kSize, [&](int rank) {
    ShmCommunicatorOptions options = make_options(name, rank, kSize, 5000);
    options.slot_bytes = ShmCommunicatorOptions{}.slot_bytes;
    ShmCommunicator comm(options);
    for (int64_t count : {int64_t{16384}, int64_t{16385}}) {  // 64 KiB of f32, and one more
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        std::vector<float> data(count);
        for (int64_t i = 0; i < count; ++i) data[i] = value_of<float>(rank, i);
        comm.all_reduce(data.data(), count, DType::kF32, op)->wait();
        for (int64_t i = 0; i < count; ++i) {
          require(data[i] == expected_reduction<float>(op, kSize, i), "count {} {} [{}] = {}",
                  count, reduce_op_name(op), i, data[i]);
        }
      }
    }
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// Whether `message` contains every part; the first missing one otherwise.
std::string missing_part(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) return part;
  }
  return {};
}

// Runs `issue` (one collective) on every rank, expecting it to fail on every
// rank with a CommError that names the operation, this rank and each peer in
// `blamed(rank)` with their `choice(rank)`, long before the timeout (so by
// the shape check, not by waiting), and the group to stay broken without
// hanging. Forks its own group.
void expect_every_rank_refuses(int size, const std::function<void(ShmCommunicator&)>& issue,
                               const std::function<std::vector<int>(int rank)>& blamed,
                               const std::function<std::string(int rank)>& choice,
                               const std::string& operation) {
  constexpr int64_t kTimeoutMs = 20'000;
  const auto pids = fork_ranks(
      size, kTimeoutMs,
      [&](ShmCommunicator& comm) {
        const int rank = comm.rank();
        const auto start = Clock::now();
        try {
          issue(comm);
          require(false, "rank {}: the mismatched {} succeeded", rank, operation);
        } catch (const CommError& e) {
          const std::string message = e.what();
          require(ms_since(start) < kTimeoutMs / 2, "rank {} failed only after {} ms: {}", rank,
                  ms_since(start), message);
          require(e.peer_ranks() == blamed(rank), "rank {} blamed the wrong ranks: {}", rank,
                  message);
          std::vector<std::string> parts = {
              "shm " + operation, "seq 0", "disagree",
              fmt::format("rank {} (this one) runs {}", rank, choice(rank))};
          for (int p : blamed(rank)) parts.push_back(fmt::format("rank {} runs {}", p, choice(p)));
          const std::string missing = missing_part(message, parts);
          require(missing.empty(), "rank {}: '{}' not in: {}", rank, missing, message);
        }
        // Broken like after any failure: later operations fail, none hangs.
        try {
          comm.barrier()->wait();
          require(false, "rank {}: barrier on a broken group succeeded", rank);
        } catch (const CommError&) {
        }
      },
      /*shared_bytes=*/64 * 1024);
  const auto codes = reap_all(pids, kHangLimit);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(codes[rank], 0) << "rank " << rank;
}

// The protocol is chosen per rank from where its operand lies: rank 0's is in
// its shared region (in place), the others' on the heap (staged). The
// protocols synchronise differently, so unchecked this is corruption or a
// hang; every rank must get an error naming both choices instead.
class ShmCommunicatorProtocolMismatch
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ShmCommunicatorProtocolMismatch, FailsOnEveryRankNamingBothChoices) {
  const auto& [operation, size] = GetParam();
  constexpr int64_t kCount = 3001;  // above the small path of the 4 KiB test slots
  auto issue = [operation](ShmCommunicator& comm) {
    const int rank = comm.rank(), size = comm.size();
    std::vector<float> heap(kCount * size, 1.0f), output(kCount * size);
    float* input = rank == 0 ? static_cast<float*>(comm.shared_buffer()) : heap.data();
    if (operation == "all_reduce") {
      comm.all_reduce(input, kCount, DType::kF32, ReduceOp::kSum)->wait();
    } else if (operation == "reduce_scatter") {
      comm.reduce_scatter(input, output.data(), kCount, DType::kF32, ReduceOp::kSum)->wait();
    } else {
      comm.all_gather(input, output.data(), kCount, DType::kF32)->wait();
    }
  };
  auto blamed = [size](int rank) {
    std::vector<int> peers;
    if (rank != 0) return std::vector<int>{0};
    for (int p = 1; p < size; ++p) peers.push_back(p);
    return peers;
  };
  auto choice = [operation](int rank) {
    const std::string shape = operation == "all_reduce"       ? "all_reduce of 3001 f32 (sum)"
                              : operation == "reduce_scatter" ? "reduce_scatter of 3001 f32 per "
                                                                "rank (sum)"
                                                              : "all_gather of 3001 f32 per rank";
    return shape + (rank == 0 ? " in place" : " staged");
  };
  expect_every_rank_refuses(size, issue, blamed, choice, operation);
}

INSTANTIATE_TEST_SUITE_P(ShmCommunicatorOperations, ShmCommunicatorProtocolMismatch,
                         ::testing::Combine(::testing::Values("all_reduce", "reduce_scatter",
                                                              "all_gather"),
                                            ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "_ranks";
                         });

// The same check catches ranks that disagree on the operand: different counts
// on the small path (its check runs on the caller's thread when the peers
// come within the inline poll), and different broadcast roots (each rank
// would take itself for the root and nothing would move).
TEST(ShmCommunicator, RanksThatDisagreeOnCountOrRootFailNamingBoth) {
  expect_every_rank_refuses(
      2,
      [](ShmCommunicator& comm) {
        std::vector<float> data(10 * (comm.rank() + 1), 1.0f);
        comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum)->wait();
      },
      [](int rank) { return std::vector<int>{1 - rank}; },
      [](int rank) {
        return fmt::format("all_reduce of {} f32 (sum) through the slots", 10 * (rank + 1));
      },
      "all_reduce");
  expect_every_rank_refuses(
      2,
      [](ShmCommunicator& comm) {
        std::vector<double> data(50, 1.0);
        comm.broadcast(data.data(), data.size(), DType::kF64, comm.rank())->wait();
      },
      [](int rank) { return std::vector<int>{1 - rank}; },
      [](int rank) { return fmt::format("broadcast of 50 f64 from root {}", rank); }, "broadcast");
}

TEST(ShmCommunicator, StoppedPeerTimesOutNamingIt) {
  constexpr int kSize = 3;
  constexpr int kStopped = 2;
  constexpr int64_t kTimeoutMs = 2000;
  const auto pids = fork_ranks(kSize, kTimeoutMs, [](ShmCommunicator& comm) {
    std::vector<float> data(1000, 1.0f);
    comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum)->wait();
    if (comm.rank() == kStopped) {
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
      require(elapsed_ms >= kTimeoutMs - 10 && elapsed_ms <= kTimeoutMs + kLateMs,
              "error after {} ms", elapsed_ms);
      require(e.peer_ranks() == std::vector<int>{kStopped}, "blamed the wrong ranks: {}", message);
      for (const char* part : {"all_reduce", "group 'test'", "seq 1", "peer rank(s) 2"}) {
        require(message.find(part) != std::string::npos, "'{}' not in: {}", part, message);
      }
    }
    // The group is broken now: later operations fail without waiting out a
    // timeout of their own (the message says so; the bound is loose, since
    // under sanitizers and a loaded machine a thread wake-up alone can take a
    // few hundred ms).
    const auto later = Clock::now();
    try {
      comm.barrier()->wait();
      require(false, "barrier on a broken group succeeded");
    } catch (const CommError& e) {
      require(std::string(e.what()).find("failed earlier") != std::string::npos, "{}", e.what());
      require(ms_since(later) < kTimeoutMs, "broken group took {} ms to fail", ms_since(later));
    }
  });
  const auto deadline = Clock::now() + kHangLimit;
  EXPECT_EQ(reap(pids[0], deadline), 0);
  EXPECT_EQ(reap(pids[1], deadline), 0);
  testing::kill_and_reap(pids[kStopped]);
}

TEST(ShmCommunicator, RecvFromStoppedPeerTimesOutNamingIt) {
  constexpr int64_t kTimeoutMs = 500;
  const auto pids = fork_ranks(2, kTimeoutMs, [](ShmCommunicator& comm) {
    comm.barrier()->wait();
    if (comm.rank() == 1) {
      ::raise(SIGSTOP);
      return;
    }
    std::vector<float> data(100);
    const auto start = Clock::now();
    try {
      comm.recv(data.data(), data.size(), DType::kF32, 1, 0)->wait();
      require(false, "recv from a stopped peer succeeded");
    } catch (const CommError& e) {
      const double elapsed_ms = ms_since(start);
      require(elapsed_ms >= kTimeoutMs - 10 && elapsed_ms <= kTimeoutMs + kLateMs,
              "error after {} ms", elapsed_ms);
      require(e.peer_ranks() == std::vector<int>{1}, "blamed the wrong ranks: {}", e.what());
      const std::string message = e.what();
      for (const char* part : {"recv", "from rank 1", "group 'test'", "timed out"}) {
        require(message.find(part) != std::string::npos, "'{}' not in: {}", part, message);
      }
    }
    // A send larger than the ring cannot finish either once the peer's
    // progress thread is frozen, and later sends fail at once.
    std::vector<float> big(10 * kTestMailboxBytes);
    try {
      comm.send(big.data(), big.size(), DType::kF32, 1, 0)->wait();
      require(false, "send to a broken mailbox succeeded");
    } catch (const CommError& e) {
      require(ms_since(start) < kTimeoutMs + kLateMs, "send failed after {} ms", ms_since(start));
    }
  });
  EXPECT_EQ(reap(pids[0], Clock::now() + kHangLimit), 0);
  testing::kill_and_reap(pids[1]);
}

// The kill comes once both ranks have exchanged a message (so the group has
// formed, and the error can only come from a recv), while rank 1 keeps
// sending.
TEST(ShmCommunicator, PeerKilledMidSendFailsTheRecv) {
  constexpr int64_t kTimeoutMs = 2000;
  PipeSignal ready;  // each rank -> the parent, after its first message
  const auto pids = fork_ranks(2, kTimeoutMs, [&](ShmCommunicator& comm) {
    std::vector<float> data(200'000, 1.0f);  // 100 rings' worth per message
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    for (bool first = true; Clock::now() < give_up; first = false) {
      if (comm.rank() == 1) {
        comm.send(data.data(), data.size(), DType::kF32, 0, 1)->wait();
        if (first) ready.notify();
        continue;
      }
      try {
        comm.recv(data.data(), data.size(), DType::kF32, 1, 1)->wait();
        if (first) ready.notify();
      } catch (const CommError& e) {
        require(e.peer_ranks() == std::vector<int>{1}, "blamed the wrong ranks: {}", e.what());
        require(std::string(e.what()).find("exited") != std::string::npos, "{}", e.what());
        return;
      }
    }
    require(false, "no error within 30 s");
  });
  EXPECT_TRUE(ready.wait(2, kHangLimit)) << "the ranks never exchanged a message";
  const auto killed_at = Clock::now();
  ::kill(pids[1], SIGKILL);
  // Reaped at once: until then rank 0 cannot tell the zombie from a live peer.
  EXPECT_EQ(reap(pids[1], Clock::now() + kHangLimit), 128 + SIGKILL);
  EXPECT_EQ(reap(pids[0], killed_at + std::chrono::milliseconds(kTimeoutMs + kLateMs)), 0);
}

TEST(ShmCommunicator, PeerKilledMidCollectiveFailsTheOthers) {
  constexpr int kSize = 3;
  constexpr int kVictim = 1;
  // Generous: under a loaded machine a rank can be descheduled long enough
  // for a 2 s timeout to fire in the first all-reduce (seen). The dead peer is
  // found by its pid, not by this timeout: the survivors must give up within
  // kLateMs of the kill, before the timeout could have fired.
  constexpr int64_t kTimeoutMs = 10000;
  static_assert(kLateMs < kTimeoutMs);
  PipeSignal ready;  // each rank -> the parent, after its first all-reduce
  const auto pids = fork_ranks(kSize, kTimeoutMs, [&](ShmCommunicator& comm) {
    // Many chunks per call, so the kill most likely lands inside a collective
    // (between two, the next one fails the same way).
    std::vector<float> data(50'000, 1.0f);
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    for (bool first = true; Clock::now() < give_up; first = false) {
      try {
        comm.all_reduce(data.data(), data.size(), DType::kF32, ReduceOp::kAvg)->wait();
        if (first) ready.notify();
      } catch (const CommError& e) {
        require(e.peer_ranks() == std::vector<int>{kVictim}, "blamed the wrong ranks: {}",
                e.what());
        return;
      }
    }
    require(false, "no error within 30 s");
  });
  // Only once the group has formed and is busy: a kill during the
  // rendezvous would fail the constructor, outside the ranks' handler.
  EXPECT_TRUE(ready.wait(kSize, kHangLimit)) << "the group never completed an all-reduce";
  const auto killed_at = Clock::now();
  ::kill(pids[kVictim], SIGKILL);
  EXPECT_EQ(reap(pids[kVictim], Clock::now() + kHangLimit), 128 + SIGKILL);
  const auto deadline = killed_at + std::chrono::milliseconds(kLateMs);
  EXPECT_EQ(reap(pids[0], deadline), 0);
  EXPECT_EQ(reap(pids[2], deadline), 0);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

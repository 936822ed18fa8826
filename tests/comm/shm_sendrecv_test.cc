// The shared-memory send/recv paths beyond the basics of
// shm_communicator_test.cc: single copy (the receiver reading the sender's
// buffer with process_vm_readv) around its 64 KiB threshold, the ring path
// when a rank turns it off, many messages in flight both ways, and the
// failures that are new with it: a sender whose receiver has exited, and a
// receiver that reads a message its sender has already given up.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/shm_communicator.h"
#include "brigade/comm/shm_mailbox.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using testing::Clock;
using testing::ms_since;
using testing::PipeSignal;
using testing::reap;
using testing::reap_all;
using testing::require;

// The single-copy threshold of shm_mailbox.cc, in floats.
constexpr int64_t kThresholdFloats = (64 << 10) / 4;
// Small rings, so ring-path messages stream through them in many pieces.
constexpr int64_t kTestMailboxBytes = 8192;
constexpr auto kHangLimit = std::chrono::seconds(60);
// What a failing operation may take beyond its cause (thread wake-ups and
// the 20 ms liveness check, on a loaded machine).
constexpr int64_t kLateMs = 5000;

// Whether one forked process can read another's memory with
// process_vm_readv, as ranks need for single copy: a child reads its parent
// (neither is the other's ancestor as the reader, like two sibling ranks).
// Where Yama (ptrace_scope 1 and up) or a missing CAP_SYS_PTRACE forbids
// it, the library falls back to the ring, and the tests of the single-copy
// path have nothing to check.
bool single_copy_possible() {
  static const bool possible = [] {
    const uint64_t word = 0x5eed'0000'0000'0001 ^ static_cast<uint64_t>(::getpid());
    const pid_t parent = ::getpid();
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
      uint64_t seen = 0;
      iovec local{&seen, sizeof(seen)};
      iovec remote{const_cast<uint64_t*>(&word), sizeof(word)};
      const bool ok = ::process_vm_readv(parent, &local, 1, &remote, 1, 0) ==
                          static_cast<ssize_t>(sizeof(seen)) &&
                      seen == word;
      ::_exit(ok ? 0 : 1);
    }
    return reap(child, Clock::now() + kHangLimit) == 0;
  }();
  return possible;
}
constexpr const char* kNoSingleCopy =
    "process_vm_readv between two processes is not allowed here (Yama ptrace_scope, or no "
    "CAP_SYS_PTRACE): send/recv take the ring path, the single copy cannot be tested";

// Forks `size` ranks; rank r opens the communicator with single copy as
// single_copy(r) says and runs body(comm).
std::vector<pid_t> fork_ranks(
    int size, int64_t timeout_ms, const std::function<void(ShmCommunicator&)>& body,
    const std::function<bool(int)>& single_copy = [](int) { return true; }) {
  const std::string name = testing::unique_segment_name("brigade-sendrecv-test");
  return testing::fork_ranks(size, [&](int rank) {
    ShmCommunicatorOptions options;
    options.segment_name = name;
    options.group_name = "test";
    options.rank = rank;
    options.size = size;
    options.timeout_ms = timeout_ms;
    options.slot_bytes = 4096;
    options.mailbox_bytes = kTestMailboxBytes;
    options.single_copy = single_copy(rank);
    ShmCommunicator comm(options);
    body(comm);
  });
}

float value(int src, int message, int64_t i) {
  return static_cast<float>((src * 131 + message * 17 + i) % 1009);
}

// Every rank sends `counts[k]` floats to every other rank (tag k), posting
// all sends first (then calling after_sends with their Works, in order of k
// and peer) and the recvs in reverse order, and checks every element.
// Returns how many of the messages it received were of single-copy size.
int64_t exchange_all(
    ShmCommunicator& comm, const std::vector<int64_t>& counts,
    const std::function<void(const std::vector<std::shared_ptr<Work>>&)>& after_sends = {}) {
  const int rank = comm.rank();
  const int size = comm.size();
  const int n = static_cast<int>(counts.size());
  std::vector<std::vector<float>> out(n), in(static_cast<size_t>(n) * size);
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < n; ++k) {
    out[k].resize(counts[k]);
    for (int64_t i = 0; i < counts[k]; ++i) out[k][i] = value(rank, k, i);
  }
  for (int k = 0; k < n; ++k) {
    for (int p = 0; p < size; ++p) {
      if (p != rank) works.push_back(comm.send(out[k].data(), counts[k], DType::kF32, p, k));
    }
  }
  if (after_sends) after_sends(works);
  int64_t large = 0;
  for (int k = n - 1; k >= 0; --k) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      auto& buffer = in[static_cast<size_t>(k) * size + p];
      buffer.assign(counts[k], -1.0f);
      works.push_back(comm.recv(buffer.data(), counts[k], DType::kF32, p, k));
      if (counts[k] >= kThresholdFloats) ++large;
    }
  }
  for (auto& work : works) work->wait();
  for (int k = 0; k < n; ++k) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const auto& buffer = in[static_cast<size_t>(k) * size + p];
      for (int64_t i = 0; i < counts[k]; ++i) {
        require(buffer[i] == value(p, k, i),
                "message {} ({} floats) from rank {}: element {} is {}, expected {}", k, counts[k],
                p, i, buffer[i], value(p, k, i));
      }
    }
  }
  return large;
}

TEST(ShmSendRecv, SizesAroundTheSingleCopyThresholdTakeTheRightPath) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  const auto pids = fork_ranks(3, 10000, [](ShmCommunicator& comm) {
    const int64_t before = comm.single_copy_messages();
    const int64_t large = exchange_all(
        comm, {kThresholdFloats - 1, kThresholdFloats, kThresholdFloats + 1, 1, 300'001});
    require(large == 6, "expected 6 messages of single-copy size, counted {}", large);
    const int64_t taken = comm.single_copy_messages() - before;
    require(taken == large, "{} messages took the single copy, expected {}", taken, large);
    comm.barrier()->wait();
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A send whose ring has room is copied in as it is posted, on the caller's
// thread: its Work is done when send() returns, with no hand-off to the
// progress thread. (One that finds the thread mid-pass is left to it, so
// the test asks this of one send in 20, each waited for before the next,
// after a barrier: until the peer has built its mailboxes, the thread
// passes over the rings back to back, waiting for the peer's probe.)
TEST(ShmSendRecv, ASmallSendWhoseRingHasRoomIsDoneWhenPosted) {
  const auto pids = fork_ranks(2, 10000, [](ShmCommunicator& comm) {
    constexpr int kSends = 20;
    std::vector<float> data(100, 1.5f);
    comm.barrier()->wait();
    int done_at_once = 0;
    for (int k = 0; k < kSends; ++k) {
      if (comm.rank() == 0) {
        auto work = comm.send(data.data(), data.size(), DType::kF32, 1, 2);
        if (work->test()) ++done_at_once;
        work->wait();
      } else {
        comm.recv(data.data(), data.size(), DType::kF32, 0, 2)->wait();
        require(data[99] == 1.5f, "message {} corrupted", k);
      }
    }
    require(comm.rank() == 1 || done_at_once > 0, "none of {} sends was done when posted", kSends);
    comm.barrier()->wait();
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A single-copy send completes before its recv is posted (the receiver
// reads the message into a private buffer once it has waited a while), so
// a rank may wait for its send before receiving, as with the ring.
TEST(ShmSendRecv, ASingleCopySendDoesNotWaitForItsRecv) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  const auto pids = fork_ranks(2, 10000, [](ShmCommunicator& comm) {
    std::vector<float> data(3 * kThresholdFloats, comm.rank() == 0 ? 4.5f : 0.0f);
    if (comm.rank() == 0) comm.send(data.data(), data.size(), DType::kF32, 1, 8)->wait();
    comm.barrier()->wait();
    if (comm.rank() == 1) {
      comm.recv(data.data(), data.size(), DType::kF32, 0, 8)->wait();
      require(std::all_of(data.begin(), data.end(), [](float v) { return v == 4.5f; }),
              "parked single-copy message corrupted");
      require(comm.single_copy_messages() == 1, "{} single-copy messages, expected 1",
              comm.single_copy_messages());
    }
    comm.barrier()->wait();
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// More single-copy messages in flight per pair than there are
// acknowledgement slots (64), mixed with ring messages, both ways; the recvs
// come in reverse order, after a barrier. Until then the receiver parks one
// single-copy message per 2 ms (the ring messages are small, so the ring
// never fills up to force it), so more than 64 of the 150 are still
// unfinished when the sends are all posted: the sender ran out of slots.
TEST(ShmSendRecv, ManyMessagesInFlightBothWays) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  const auto pids = fork_ranks(2, 20000, [](ShmCommunicator& comm) {
    std::vector<int64_t> counts;
    for (int k = 0; k < 200; ++k) counts.push_back(k % 4 == 0 ? 10 : kThresholdFloats + 97 * k);
    const int64_t large =
        exchange_all(comm, counts, [&](const std::vector<std::shared_ptr<Work>>& sends) {
          int64_t unfinished = 0;
          for (size_t k = 0; k < sends.size(); ++k) {
            if (counts[k] >= kThresholdFloats && !sends[k]->test()) ++unfinished;
          }
          require(unfinished > 64, "only {} single-copy sends were in flight at once", unfinished);
          comm.barrier()->wait();
        });
    require(comm.single_copy_messages() == large, "{} of {} large messages took the single copy",
            comm.single_copy_messages(), large);
    // Every send completed by its acknowledgement, not by its deadline
    // (which would have broken the mailboxes): they still work.
    exchange_all(comm, {1});
    comm.barrier()->wait();
  });
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Rank 1 turns single copy off: what it receives comes through the ring,
// what rank 0 receives does not (unless the kernel refuses the reads: then
// nothing does); the data is right either way.
TEST(ShmSendRecv, ARankWithoutSingleCopyReceivesThroughTheRing) {
  const bool possible = single_copy_possible();
  const auto pids = fork_ranks(
      2, 10000,
      [&](ShmCommunicator& comm) {
        const int64_t large = exchange_all(comm, {kThresholdFloats, 250'000, 100});
        const int64_t expected = comm.rank() == 1 || !possible ? 0 : large;
        require(comm.single_copy_messages() == expected,
                "rank {}: {} messages took the single copy, expected {}", comm.rank(),
                comm.single_copy_messages(), expected);
        comm.barrier()->wait();
      },
      [](int rank) { return rank != 1; });
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Rank 1 has exited (and been reaped) before rank 0 sends it a single-copy
// message: the send fails naming it, long before the timeout.
TEST(ShmSendRecv, SendToARankThatExitedFailsNamingIt) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  constexpr int64_t kTimeoutMs = 30000;
  PipeSignal go;  // the parent -> rank 0, once rank 1 is gone
  const auto pids = fork_ranks(2, kTimeoutMs, [&](ShmCommunicator& comm) {
    // One single-copy message first: rank 1 can read rank 0's memory, so the
    // send below takes the single-copy path (and waits for an acknowledgement).
    std::vector<float> first(kThresholdFloats, 2.0f);
    if (comm.rank() == 0) comm.send(first.data(), first.size(), DType::kF32, 1, 1)->wait();
    if (comm.rank() == 1) {
      comm.recv(first.data(), first.size(), DType::kF32, 0, 1)->wait();
      require(comm.single_copy_messages() == 1, "the first message took the ring");
    }
    comm.barrier()->wait();
    if (comm.rank() == 1) ::_exit(0);  // at once: no recv, no clean shutdown
    require(go.wait(1, kHangLimit), "the parent never said rank 1 is gone");
    std::vector<float> data(4 * kThresholdFloats, 1.0f);
    const auto start = Clock::now();
    try {
      comm.send(data.data(), data.size(), DType::kF32, 1, 0)->wait();
      require(false, "a send to a rank that exited succeeded");
    } catch (const CommError& e) {
      require(e.peer_ranks() == std::vector<int>{1}, "blamed the wrong ranks: {}", e.what());
      require(std::string(e.what()).find("exited") != std::string::npos, "{}", e.what());
      require(ms_since(start) < kLateMs, "the error took {} ms", ms_since(start));
    }
  });
  EXPECT_EQ(reap(pids[1], Clock::now() + kHangLimit), 0);
  go.notify();
  EXPECT_EQ(reap(pids[0], Clock::now() + kHangLimit), 0);
}

// Waits until `pid` is stopped (its /proc state is 'T'), up to `limit`.
bool wait_stopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WUNTRACED | WNOHANG) == pid && WIFSTOPPED(status)) return true;
    std::this_thread::yield();
  }
  return false;
}

// Rank 0's single-copy send times out while rank 1 is stopped, so it takes
// the message back (and, with free_buffer, unmaps the buffer); once rank 1
// runs again its recv finds the frame, reads the buffer (or fails to) and
// must fail naming the withdrawal, not keep the data or blame a bad address.
// The frame stays in the ring: rank 1 must not read it again and again.
void expect_a_withdrawn_message_fails_the_recv(bool free_buffer) {
  constexpr int64_t kSendTimeoutMs = 1000;
  // Long enough for several re-reads (one per 2 ms of parking) if the failed
  // frame were read again; a sleep, as nothing signals what must not happen.
  constexpr auto kQuietWindow = std::chrono::milliseconds(100);
  PipeSignal go;         // the parent -> rank 0, once rank 1 is stopped
  PipeSignal withdrawn;  // rank 0 -> the parent, once its send failed
  PipeSignal finished;   // rank 1 -> rank 0: the buffer may go
  const std::string name = testing::unique_segment_name("brigade-sendrecv-test");
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    ShmCommunicatorOptions options;
    options.segment_name = name;
    options.group_name = "test";
    options.rank = rank;
    options.size = 2;
    // Rank 1's recv must outlive its stop; rank 0's send must not.
    options.timeout_ms = rank == 0 ? kSendTimeoutMs : 60000;
    options.slot_bytes = 4096;
    options.mailbox_bytes = kTestMailboxBytes;
    ShmCommunicator comm(options);
    std::vector<float> data(2 * kThresholdFloats, rank == 0 ? 3.0f : 0.0f);
    // One message first, so rank 0 knows rank 1 can read it (the verdict
    // comes from rank 1's progress thread, frozen below).
    if (rank == 0) comm.send(data.data(), data.size(), DType::kF32, 1, 4)->wait();
    if (rank == 1) comm.recv(data.data(), data.size(), DType::kF32, 0, 4)->wait();
    require(comm.single_copy_messages() == rank, "rank {}: the first message took the ring", rank);
    comm.barrier()->wait();
    if (rank == 1) {
      ::raise(SIGSTOP);  // before the message exists: nothing can read it early
      try {
        comm.recv(data.data(), data.size(), DType::kF32, 0, 5)->wait();
        finished.notify();
        require(false, "the recv kept a message its sender had withdrawn");
      } catch (const CommError& e) {
        finished.notify();
        require(std::string(e.what()).find("withdrew") != std::string::npos, "{}", e.what());
        require(e.peer_ranks() == std::vector<int>{0}, "blamed the wrong ranks: {}", e.what());
      }
      const int64_t reads = comm.single_copy_reads();
      require(reads == 2, "{} single-copy reads, expected 2", reads);
      std::this_thread::sleep_for(kQuietWindow);
      require(comm.single_copy_reads() == reads, "the withdrawn message was read {} more times",
              comm.single_copy_reads() - reads);
      return;
    }
    const size_t bytes = data.size() * sizeof(float);
    void* mapped =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    require(mapped != MAP_FAILED, "mmap of {} bytes failed", bytes);
    auto* buffer = static_cast<float*>(mapped);
    std::fill(buffer, buffer + data.size(), 3.0f);
    require(go.wait(1, kHangLimit), "the parent never saw rank 1 stop");
    try {
      comm.send(buffer, data.size(), DType::kF32, 1, 5)->wait();
      require(false, "a send to a stopped rank succeeded");
    } catch (const CommError& e) {
      require(std::string(e.what()).find("timed out") != std::string::npos, "{}", e.what());
    }
    if (free_buffer) require(::munmap(mapped, bytes) == 0, "munmap failed");
    withdrawn.notify();
    require(finished.wait(1, kHangLimit), "rank 1 never finished its recv");
    if (!free_buffer) ::munmap(mapped, bytes);
  });
  EXPECT_TRUE(wait_stopped(pids[1], kHangLimit)) << "rank 1 never stopped";
  go.notify();
  EXPECT_TRUE(withdrawn.wait(1, kHangLimit)) << "rank 0's send never failed";
  ::kill(pids[1], SIGCONT);
  const auto codes = reap_all(pids, kHangLimit);
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(ShmSendRecv, AMessageItsSenderWithdrewFailsTheRecv) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  expect_a_withdrawn_message_fails_the_recv(false);
}

// Its buffer gone, the read fails with "Bad address"; the recv still says
// what happened: the sender withdrew the message.
TEST(ShmSendRecv, AMessageItsSenderWithdrewAndFreedFailsTheRecvNamingTheWithdrawal) {
  if (!single_copy_possible()) GTEST_SKIP() << kNoSingleCopy;
  expect_a_withdrawn_message_fails_the_recv(true);
}

// The voluntary context switches of this process's thread `tid` so far.
int64_t voluntary_switches(int tid) {
  std::ifstream status(fmt::format("/proc/self/task/{}/status", tid));
  const std::string key = "voluntary_ctxt_switches:";
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + key.size());
  }
  throw Error(fmt::format("no {} in /proc/self/task/{}/status", key, tid));
}

// A peer that died between the rendezvous and building its mailboxes never
// publishes its probe. Its verdict is "not readable" once it is seen gone,
// so the progress thread idles (a wake-up per millisecond); and a thread
// kept busy by anything nobody waits for lengthens its naps to a
// millisecond. Either way it must not wake every 50 us for the
// communicator's life (what it did before both): this fails only when both
// are broken, a regression of the thread's cost either way shows.
TEST(ShmSendRecv, APeerThatDiedBeforeBuildingItsMailboxesDoesNotKeepTheThreadBusy) {
  constexpr auto kWindow = std::chrono::milliseconds(500);
  constexpr int64_t kMostSwitches = 2 * 500;  // idle: about one per millisecond
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(reap(dead, Clock::now() + kHangLimit), 0);
  const auto pids = testing::fork_ranks(1, [&](int) {
    std::vector<std::byte> region(static_cast<size_t>(ShmMailboxes::region_bytes(2, 4096)));
    const uint64_t self = static_cast<uint64_t>(::getpid());
    ShmMailboxes mailboxes("test", FlightRecorder::GroupId{}, 0, 2, 60000, region.data(), 4096,
                           [&](int r) { return r == 0 ? self : static_cast<uint64_t>(dead); });
    // The forked child had one thread; the mailboxes started the other.
    int thread = 0;
    DIR* tasks = ::opendir("/proc/self/task");
    require(tasks != nullptr, "cannot list /proc/self/task");
    while (const dirent* entry = ::readdir(tasks)) {
      const int tid = std::atoi(entry->d_name);
      if (tid > 0 && tid != ::gettid()) thread = tid;
    }
    ::closedir(tasks);
    require(thread != 0, "no progress thread in /proc/self/task");
    const int64_t before = voluntary_switches(thread);
    std::this_thread::sleep_for(kWindow);
    const int64_t switches = voluntary_switches(thread) - before;
    require(switches < kMostSwitches, "the progress thread woke {} times in {} ms", switches,
            kWindow.count());
  });
  EXPECT_EQ(reap(pids[0], Clock::now() + kHangLimit), 0);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

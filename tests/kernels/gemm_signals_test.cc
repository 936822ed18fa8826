// Signals and the GEMMs (core/signals.h): oneDNN 2.x's JIT sgemm points rsp
// into the heap while it runs, so a handler entered on a computing thread
// corrupts the heap. Each case runs in a fresh process (a death test in
// the "threadsafe" style re-executes this binary), because the quiet
// thread must be set up before any other thread exists.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/signals.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/gemm.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

constexpr int kMaxComputeThreads = 64;
pthread_t g_compute[kMaxComputeThreads];
std::atomic<int> g_n_compute{0};
std::atomic<int> g_handled{0};
std::atomic<int> g_on_compute_thread{0};

void count_signal(int) {
  const pthread_t self = pthread_self();
  const int n = g_n_compute.load();
  for (int i = 0; i < n; ++i) {
    if (pthread_equal(self, g_compute[i])) g_on_compute_thread.fetch_add(1);
  }
  g_handled.fetch_add(1);
}

enum ChildExit { kOk = 0, kHandlerOnComputeThread = 3, kTooFewSignals = 4 };

// The shapes oneDNN 2.7 runs in its rsp-moving kernels on AVX-512 and AVX2
// machines (found by a handler that checks its own stack address).
void gemms_under_a_signal_storm(bool quiet_thread) {
  if (quiet_thread) take_signals_on_a_quiet_thread();
  set_num_threads(2);
  // Every thread that computes: the main thread and OpenMP's team.
#pragma omp parallel
  { g_compute[omp_get_thread_num()] = pthread_self(); }
  g_n_compute = std::min(omp_get_max_threads(), kMaxComputeThreads);
  ::signal(SIGUSR1, count_signal);

  const pid_t self = ::getpid();
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    while (!stop.load()) {
      ::kill(self, SIGUSR1);  // process-directed: the kernel picks the thread
      ::usleep(20);
    }
  });
  struct Shape {
    int64_t m, n, k;
    bool trans_b;
  };
  const Shape shapes[] = {{64, 768, 768, false}, {32, 32, 128, false}, {32, 32, 96, true}};
  std::vector<float> a(64 * 768, 0.5f), b(768 * 768, 0.25f), c(64 * 768);
  constexpr int kSignals = 2000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (g_handled.load() < kSignals && std::chrono::steady_clock::now() < deadline) {
    for (const Shape& s : shapes) {
      cpu::gemm(false, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(),
                s.trans_b ? s.k : s.n, 0.0f, c.data(), s.n);
    }
  }
  stop = true;
  sender.join();
  // Freeing what the GEMMs' workspaces neighboured is where a corrupted
  // heap aborts.
  a = {};
  b = {};
  c = {};
  if (g_on_compute_thread.load() > 0) std::_Exit(kHandlerOnComputeThread);
  std::_Exit(g_handled.load() >= kSignals ? kOk : kTooFewSignals);
}

class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SignalsTest, HandlersNeverRunOnAThreadInsideAGemm) {
  EXPECT_EXIT(gemms_under_a_signal_storm(true), ::testing::ExitedWithCode(kOk), "");
}

TEST_F(SignalsTest, DefaultActionsStayWhatTheyWere) {
  // No handler: SIGTERM still ends the process by that signal.
  EXPECT_EXIT(
      {
        take_signals_on_a_quiet_thread();
        ::kill(::getpid(), SIGTERM);
        ::alarm(10);
        for (;;) ::pause();
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

// What the launcher's agent does: block on every thread, then collect with
// sigtimedwait; children start with the mask the process began with.
void collect_sigint_with_sigtimedwait() {
  take_signals_on_a_quiet_thread();
  sigset_t set;
  ::sigemptyset(&set);
  ::sigaddset(&set, SIGINT);
  block_on_quiet_thread(set);
  ::kill(::getpid(), SIGINT);
  const timespec wait{10, 0};
  const int got = ::sigtimedwait(&set, nullptr, &wait);
  unblock_on_quiet_thread(set);
  const sigset_t child = startup_signal_mask();
  std::_Exit(got == SIGINT && ::sigismember(&child, SIGINT) == 0 ? 0 : 1);
}

TEST_F(SignalsTest, QuietThreadCanBeToldToLeaveSignalsPending) {
  EXPECT_EXIT(collect_sigint_with_sigtimedwait(), ::testing::ExitedWithCode(0), "");
}

// A child spawned meanwhile starts with the process's startup mask (here:
// nothing blocked), and the thread gets its own mask back afterwards. The
// child is grep itself: a shell would unblock everything as it starts.
void spawn_with_the_startup_mask() {
  take_signals_on_a_quiet_thread();
  int fds[2];
  if (::pipe(fds) != 0) std::_Exit(2);
  pid_t child = -1;
  {
    const StartupMaskForChildren child_mask;
    child = ::fork();
    if (child == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::execlp("grep", "grep", "SigBlk", "/proc/self/status", static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ::close(fds[1]);
  char line[128] = {};
  const ssize_t n = ::read(fds[0], line, sizeof(line) - 1);
  ::waitpid(child, nullptr, 0);
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &now);
  const bool startup_mask = n > 0 && std::string(line) == "SigBlk:\t0000000000000000\n";
  std::_Exit(startup_mask && ::sigismember(&now, SIGTERM) == 1 ? 0 : 1);
}

TEST_F(SignalsTest, ChildrenStartWithTheMaskTheProcessStartedWith) {
  EXPECT_EXIT(spawn_with_the_startup_mask(), ::testing::ExitedWithCode(0), "");
}

TEST_F(SignalsTest, WritesToAClosedPipeStillRaiseSigpipe) {
  // SIGPIPE goes to the writing thread; blocked, `brigade ... | head` would
  // go on computing with nowhere to write.
  EXPECT_EXIT(
      {
        take_signals_on_a_quiet_thread();
        int fds[2];
        if (::pipe(fds) != 0) std::_Exit(2);
        ::close(fds[0]);
        const char byte = 'x';
        (void)!::write(fds[1], &byte, 1);
        std::_Exit(3);
      },
      ::testing::KilledBySignal(SIGPIPE), "");
}

void block_unblock_then_sigint() {
  take_signals_on_a_quiet_thread();
  sigset_t set;
  ::sigemptyset(&set);
  ::sigaddset(&set, SIGINT);
  block_on_quiet_thread(set);
  unblock_on_quiet_thread(set);
  ::alarm(10);  // were SIGINT left pending, SIGALRM would end the wait instead
  ::kill(::getpid(), SIGINT);
  for (;;) ::pause();
}

TEST_F(SignalsTest, UnblockingHandsSignalsBackToTheQuietThread) {
  EXPECT_EXIT(block_unblock_then_sigint(), ::testing::KilledBySignal(SIGINT), "");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

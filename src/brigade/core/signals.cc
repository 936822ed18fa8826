#include "brigade/core/signals.h"

#include <pthread.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "brigade/core/error.h"

namespace brigade {
namespace {

// Every signal but those the kernel sends to the thread that caused them
// (a fault, a write to a closed pipe or past the file size limit: blocked,
// they would stay pending there, and `brigade ... | head` would no longer
// end quietly) and those no mask holds.
sigset_t asynchronous_signals() {
  sigset_t set;
  ::sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT, SIGPIPE, SIGXFSZ,
                  SIGKILL, SIGSTOP}) {
    ::sigdelset(&set, sig);
  }
  return set;
}

struct QuietThread {
  std::mutex mutex;
  std::condition_variable changed;
  sigset_t startup_mask;
  sigset_t extra_blocked;  // what the quiet thread blocks beyond startup_mask
  uint64_t requested = 0, applied = 0;
};

// Never destroyed: the quiet thread waits on it until the process ends.
QuietThread* g_quiet = nullptr;
std::once_flag g_once;

void run_quiet_thread(QuietThread* q) {
  std::unique_lock<std::mutex> lock(q->mutex);
  for (;;) {
    // Handlers run here, between and during these waits.
    q->changed.wait(lock, [q] { return q->requested != q->applied; });
    sigset_t mask = q->startup_mask;
    ::sigorset(&mask, &mask, &q->extra_blocked);
    ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    q->applied = q->requested;
    q->changed.notify_all();
  }
}

void request_quiet_mask(void (*edit)(sigset_t* extra, const sigset_t& set), const sigset_t& set) {
  if (g_quiet == nullptr) return;
  std::unique_lock<std::mutex> lock(g_quiet->mutex);
  edit(&g_quiet->extra_blocked, set);
  const uint64_t request = ++g_quiet->requested;
  g_quiet->changed.notify_all();
  g_quiet->changed.wait(lock, [request] { return g_quiet->applied >= request; });
}

}  // namespace

void take_signals_on_a_quiet_thread() {
  std::call_once(g_once, [] {
    auto* q = new QuietThread;
    ::pthread_sigmask(SIG_SETMASK, nullptr, &q->startup_mask);
    ::sigemptyset(&q->extra_blocked);
    // Started before the block below, so it keeps the startup mask.
    std::thread(run_quiet_thread, q).detach();
    const sigset_t async = asynchronous_signals();
    const int rc = ::pthread_sigmask(SIG_BLOCK, &async, nullptr);
    BRIGADE_CHECK(rc == 0, "pthread_sigmask failed: {}", rc);
    g_quiet = q;
  });
}

bool signals_on_a_quiet_thread() {
  return g_quiet != nullptr;
}

sigset_t startup_signal_mask() {
  sigset_t mask;
  if (g_quiet != nullptr) return g_quiet->startup_mask;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  return mask;
}

StartupMaskForChildren::StartupMaskForChildren() {
  const sigset_t startup = startup_signal_mask();
  ::pthread_sigmask(SIG_SETMASK, &startup, &previous_);
}

StartupMaskForChildren::~StartupMaskForChildren() {
  ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

void block_on_quiet_thread(const sigset_t& set) {
  request_quiet_mask([](sigset_t* extra, const sigset_t& s) { ::sigorset(extra, extra, &s); }, set);
}

void unblock_on_quiet_thread(const sigset_t& set) {
  request_quiet_mask(
      [](sigset_t* extra, const sigset_t& s) {
        for (int sig = 1; sig < NSIG; ++sig) {
          if (::sigismember(&s, sig) == 1) ::sigdelset(extra, sig);
        }
      },
      set);
}

}  // namespace brigade

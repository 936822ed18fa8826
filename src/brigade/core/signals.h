// Where asynchronous signals are taken: on one quiet thread, never on a
// thread that computes.
//
// Why: the JIT sgemm kernels of oneDNN 2.x (Debian 12's libdnnl 2.7) point
// rsp at a heap workspace while they run (oneDNN issue 4845, fixed in
// 3.11). A signal handler entered on a thread inside one has its frame
// written by the kernel over whatever heap memory lies below that address,
// and the process later aborts in free() ("corrupted size vs. prev_size").
// A SIGINT that stopped `brigade train` did exactly that once in a few
// hundred runs; a burst of SIGUSR1 during GEMMs does it within a second.
//
// So main() calls take_signals_on_a_quiet_thread() before any other thread
// exists: it starts a thread that only waits, and blocks the asynchronous
// signals in the calling thread, whose mask every later thread (OpenMP's
// included) inherits. The kernel then delivers a process-directed signal to
// the quiet thread: handlers installed with signal()/sigaction() run on its
// stack, and default actions (terminate, stop) are what they were.
#pragma once

#include <signal.h>

namespace brigade {

// Once per process, first thing in main(). A second call does nothing.
void take_signals_on_a_quiet_thread();

// Whether take_signals_on_a_quiet_thread() ran in this process.
bool signals_on_a_quiet_thread();

// The signal mask the process started with: what a child it execs should
// start with (the calling thread's mask when there is no quiet thread).
sigset_t startup_signal_mask();

// For the span of a spawn (popen, execve): the calling thread takes the
// mask the process started with, so the child starts with it too (a mask
// survives exec; a child that started with SIGTERM blocked could not be
// stopped). No GEMM runs on the thread meanwhile, so a handler may run here.
class StartupMaskForChildren {
 public:
  StartupMaskForChildren();
  ~StartupMaskForChildren();
  StartupMaskForChildren(const StartupMaskForChildren&) = delete;
  StartupMaskForChildren& operator=(const StartupMaskForChildren&) = delete;

 private:
  sigset_t previous_;
};

// Blocks `set` on the quiet thread too, for code that collects those
// signals itself with sigtimedwait (the launcher's agent): while any thread
// leaves a signal unblocked it is delivered there, not left pending. Returns
// once the quiet thread has applied it. unblock_... undoes it. Both do
// nothing without a quiet thread.
void block_on_quiet_thread(const sigset_t& set);
void unblock_on_quiet_thread(const sigset_t& set);

}  // namespace brigade

// Running one test as several forked processes, the way workers run: each
// rank is a child process, checks inside it throw (gtest assertions would not
// reach the parent), and the parent reaps every child it started, killing any
// that outlive the test's limit, so no test leaves processes behind.
#pragma once

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "brigade/core/error.h"

namespace brigade::testing {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A check inside a forked rank: throws, so the rank exits 1 with the message
// on stderr.
template <typename... Args>
void require(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// A signal between the processes of a test, in place of a sleep: a pipe made
// before forking, so every child inherits both ends. notify() sends one
// token; wait(n, limit) takes n tokens (from any senders) and says whether
// they came within `limit`, so a process that died before notifying fails
// the waiting one instead of hanging it. One process should wait on a given
// signal; use one signal per direction.
class PipeSignal {
 public:
  PipeSignal() {
    if (::pipe(fds_) != 0) throw Error("pipe() failed for a test signal");
  }
  ~PipeSignal() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  PipeSignal(const PipeSignal&) = delete;
  PipeSignal& operator=(const PipeSignal&) = delete;

  void notify() const {
    const char token = 1;
    while (::write(fds_[1], &token, 1) != 1) {
      if (errno != EINTR) throw Error("cannot write a test signal");
    }
  }

  bool wait(int n, std::chrono::milliseconds limit) const {
    const auto deadline = Clock::now() + limit;
    for (int got = 0; got < n;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd fd{fds_[0], POLLIN, 0};
      if (::poll(&fd, 1, static_cast<int>(left)) <= 0) continue;  // EINTR, or the limit
      char token = 0;
      if (::read(fds_[0], &token, 1) == 1) ++got;
    }
    return true;
  }

 private:
  int fds_[2] = {-1, -1};
};

// Forks `size` children; child r runs body(r) and exits 0 if it returned, 1
// if it threw (the message goes to stderr). Returns the pids in rank order;
// -1 where fork failed.
inline std::vector<pid_t> fork_ranks(int size, const std::function<void(int rank)>& body) {
  std::fflush(nullptr);  // or buffered output would be written once per child
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int status = 0;
      try {
        body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        status = 1;
      }
      std::fflush(stderr);
      ::_exit(status);  // no gtest teardown, no destructors of the parent's objects
    }
    pids.push_back(pid);
  }
  return pids;
}

// Reaps one child, continuing and killing it if it is still there at
// `deadline`. Returns its exit code, 128 + signal, or -1 if it had to be killed.
inline int reap(pid_t pid, Clock::time_point deadline) {
  if (pid <= 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::vector<int> reap_all(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(reap(pid, deadline));
  return codes;
}

// Kills a child outright (continuing it first if it was stopped) and reaps it.
inline void kill_and_reap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGCONT);
  ::kill(pid, SIGKILL);
  reap(pid, Clock::now() + std::chrono::seconds(2));
}

}  // namespace brigade::testing

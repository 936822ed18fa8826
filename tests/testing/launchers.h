// `brigade launch` processes a multi-node test starts itself (fork, exec),
// each one's stderr to a file, so that it can start one while others run and
// kill or wait for each by pid; every one left is SIGKILLed by the
// destructor. And waiting for a condition without a fixed sleep.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/run_brigade.h"

namespace brigade::testing {

class Launchers {
 public:
  explicit Launchers(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~Launchers() {
    for (const pid_t pid : pids_) {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  }
  Launchers(const Launchers&) = delete;
  Launchers& operator=(const Launchers&) = delete;

  // `brigade ARGS...`, its stderr in DIR/NAME.err.
  pid_t start(const std::string& name, const std::vector<std::string>& args) {
    const std::string err = (dir_ / (name + ".err")).string();
    std::vector<std::string> argv = {kBrigade};
    argv.insert(argv.end(), args.begin(), args.end());
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(126);
      std::vector<char*> p;
      for (const std::string& a : argv) p.push_back(const_cast<char*>(a.c_str()));
      p.push_back(nullptr);
      ::execv(p[0], p.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }
  // Its exit status (128 + signal when killed), or -1 past the deadline.
  int wait(pid_t pid, std::chrono::steady_clock::time_point deadline) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::erase(pids_, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // What NAME wrote to stderr so far.
  std::string err(const std::string& name) const {
    std::ifstream in(dir_ / (name + ".err"));
    return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  std::filesystem::path dir_;
  std::vector<pid_t> pids_;
};

// Whether `ready` became true within `limit` (checked every 10 ms).
inline bool wait_for(const std::function<bool()>& ready, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace brigade::testing

// An outside program (headless Chromium, Prometheus, a brigade launcher) run
// by a test: in its own process group, with its output in files, waited for
// with a deadline and stopped by its pid (the group, so the helpers it
// forked go too) whatever happens to the test.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace brigade::testing {

// The program's path if `name` is on PATH (or is an executable path), else "".
inline std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdout and stderr appended to the files.
  ChildProcess(const std::vector<std::string>& argv, const std::filesystem::path& out,
               const std::filesystem::path& err) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(err_fd, STDERR_FILENO);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);  // also here, so a stop right after the fork reaches the group
  }
  ~ChildProcess() { stop(SIGKILL, std::chrono::seconds(0)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The exit status (128 + signal for a signal) once it exits, or nullopt
  // if it still runs at the deadline.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!status_) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }

  // Sends `sig` to the process group; after `grace`, SIGKILL. Returns the status.
  std::optional<int> stop(int sig, std::chrono::seconds grace) {
    if (pid_ <= 0) return status_;
    if (!status_) ::kill(-pid_, sig);
    if (!wait_for(grace)) {
      ::kill(-pid_, SIGKILL);
      wait_for(std::chrono::seconds(60));
    }
    ::kill(-pid_, SIGKILL);  // helpers of a program that exited (its group outlives it)
    return status_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace brigade::testing

// Finding and watching the processes a test's command started through the
// launcher (its workers are not the test's children): by parent pid and
// environment, from /proc. For tests that kill or stop one worker, and for
// waiting until every process of a run is gone instead of sleeping.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace brigade::testing {

// Fields of /proc/PID/stat after the command name (which may hold spaces):
// [0] is the state (R, S, T, Z, ...), [1] the parent pid, and [49] the exit
// code in waitpid's form (Linux 3.5+), readable while the process is a zombie.
inline std::optional<std::vector<std::string>> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    const auto stat = proc_stat(pid);
    if (stat && stat->size() > 1 && std::stoi((*stat)[1]) == parent) pids.push_back(pid);
  }
  return pids;
}

// The value of `name` in a process's environment, or "".
inline std::string env_of(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.starts_with(name + "=")) return entry.substr(name.size() + 1);
  }
  return "";
}

// Waits until the launcher `launcher` has a worker with RANK=rank; -1 if
// none appears by the deadline.
inline pid_t wait_for_worker(pid_t launcher, int rank, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    for (pid_t pid : children_of(launcher)) {
      if (env_of(pid, "RANK") == std::to_string(rank)) return pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

// Processes whose command line mentions `marker` (a test's own temp path).
inline std::vector<pid_t> processes_mentioning(const std::string& marker) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(marker) == std::string::npos) continue;
    const auto stat = proc_stat(std::stoi(name));
    if (stat && !stat->empty() && (*stat)[0] != "Z") pids.push_back(std::stoi(name));
  }
  return pids;
}

// After a launcher was killed, its workers follow it (PR_SET_PDEATHSIG):
// waits until none is left, killing by pid whatever outlives `limit`.
// Returns false if any had to be killed.
inline bool wait_until_gone(const std::string& marker, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!processes_mentioning(marker).empty()) {
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : processes_mentioning(marker)) ::kill(pid, SIGKILL);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace brigade::testing

// The fake cluster of scripts/fake_cluster.sh for tests: nodes as network
// namespaces on one machine, processes started on them by pid, and the
// cluster brought down whatever happens (the Cluster destructor). The same
// pieces as tests/cli/multi_node_cluster_test.cc's, shared from here.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace brigade::testing {
namespace cluster_detail {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
}  // namespace cluster_detail
using namespace cluster_detail;

inline const std::string kFakeClusterScript = BRIGADE_SOURCE_DIR "/scripts/fake_cluster.sh";

inline std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts argv with stdout and stderr into `log`, without GLOO_SOCKET_IFNAME:
// the multi-node job must find its addresses unaided.
inline pid_t spawn(const std::vector<std::string>& argv, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::unsetenv("GLOO_SOCKET_IFNAME");
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

struct ClusterResult {
  int status = -1;  // exit code, or 128 + signal
  std::string output;
};

// Waits for `pid` to exit; past `limit` kills it, and fails the test.
inline ClusterResult finish(pid_t pid, const fs::path& log, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wait_status, 0);
      ADD_FAILURE() << "pid " << pid << " did not finish within " << limit.count()
                    << " s; its output:\n"
                    << read_all(log);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  return {WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status),
          read_all(log)};
}

class Cluster {
 public:
  Cluster(std::string name, std::string net, const fs::path& dir)
      : name_(std::move(name)), net_(std::move(net)), dir_(dir) {}
  // Always down, even when the test failed halfway; a no-op when not up.
  ~Cluster() { script({"down"}); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  std::vector<std::string> argv(const std::vector<std::string>& args) const {
    std::vector<std::string> all = {kFakeClusterScript, "--name", name_, "--net", net_};
    all.insert(all.end(), args.begin(), args.end());
    return all;
  }
  ClusterResult script(const std::vector<std::string>& args, std::chrono::seconds limit = 60s) {
    const fs::path log = dir_ / ("script_" + std::to_string(calls_++) + ".log");
    return finish(spawn(argv(args), log), log, limit);
  }
  pid_t start_on(int node, const std::vector<std::string>& command, const fs::path& log) {
    std::vector<std::string> args = {"run", std::to_string(node)};
    args.insert(args.end(), command.begin(), command.end());
    return spawn(argv(args), log);
  }
  std::string address(int node) const { return net_ + "." + std::to_string(10 + node); }
  std::string netns(int node) const { return name_ + std::to_string(node); }

 private:
  std::string name_, net_;
  fs::path dir_;
  int calls_ = 0;
};

// The processes a test started (launchers, by their pids), killed and
// reaped on every way out of the test, an ASSERT's early return included:
// declared after the Cluster, so before it goes down, never left to the
// namespaces' teardown. A pid is forgotten only once finish() reaped it, so
// it can never be another process's.
class Started {
 public:
  Started() = default;
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;
  ~Started() {
    for (const pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      int wait_status = 0;
      ::waitpid(pid, &wait_status, 0);
    }
  }
  pid_t add(pid_t pid) {
    pids_.push_back(pid);
    return pid;
  }
  // testing::finish() of one of them.
  ClusterResult finish(pid_t pid, const fs::path& log, std::chrono::seconds limit) {
    ClusterResult r = testing::finish(pid, log, limit);
    std::erase(pids_, pid);
    return r;
  }

 private:
  std::vector<pid_t> pids_;
};

// Why these tests cannot run here, or "".
inline std::string missing_prerequisite() {
  if (::geteuid() != 0) return "needs root (network namespaces, bridges, tc)";
  if (std::system("ip netns list >/dev/null 2>&1") != 0) return "`ip netns` is not available";
  return "";
}

#define SKIP_WITHOUT_FAKE_CLUSTER()                                                       \
  if (const std::string why = ::brigade::testing::missing_prerequisite(); !why.empty()) { \
    GTEST_SKIP() << "fake_cluster tests skipped: " << why;                                \
  }

}  // namespace brigade::testing

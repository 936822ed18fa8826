// `brigade bench comm` end to end: the real binary launches real workers over
// the shm backend, and every line it prints must be a measurement a script can
// rely on (compare_comm.py parses these lines). Plus connect_world's error for
// a worker started outside `brigade launch`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "brigade/comm/world.h"
#include "brigade/core/error.h"

namespace {

const char* const kBrigade = BRIGADE_BINARY_DIR "/brigade";
// The run under test takes a few seconds; past this it is hung.
constexpr auto kCommandTimeout = std::chrono::seconds(60);

struct Output {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// Runs the binary with both pipes drained as it goes (a full pipe would stall
// it) and kills it past kCommandTimeout.
Output run_brigade(const std::vector<std::string>& args) {
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(::pipe(out_pipe), 0);
  EXPECT_EQ(::pipe(err_pipe), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    std::vector<char*> argv{const_cast<char*>(kBrigade)};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    ::execv(kBrigade, argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Output output;
  const auto deadline = std::chrono::steady_clock::now() + kCommandTimeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&output.out, &output.err};
  int open_pipes = 2;
  while (open_pipes > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "brigade " << args[0] << " did not finish within the timeout";
      break;
    }
    if (::poll(fds, 2, 200) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  int wait_status = 0;
  ::waitpid(pid, &wait_status, 0);
  output.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  return output;
}

TEST(BenchComm, ShmJsonLinesCoverEveryOpWithPositiveBandwidth) {
  const Output result = run_brigade(
      {"bench", "comm", "--nproc", "2", "--backend", "shm", "--max-bytes", "64K", "--json"});
  ASSERT_EQ(result.status, 0) << result.err;

  std::map<std::string, std::set<int64_t>> sizes_by_op;
  std::istringstream lines(result.out);
  int line_count = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_count;
    nlohmann::json row;
    ASSERT_NO_THROW(row = nlohmann::json::parse(line)) << "not JSON: " << line;
    EXPECT_EQ(row.at("backend"), "shm") << line;
    EXPECT_EQ(row.at("nproc"), 2) << line;
    EXPECT_GT(row.at("bytes").get<int64_t>(), 0) << line;
    EXPECT_GT(row.at("iters").get<int64_t>(), 0) << line;
    EXPECT_GT(row.at("time_us").get<double>(), 0) << line;
    EXPECT_GT(row.at("algbw_gbps").get<double>(), 0) << line;
    EXPECT_GT(row.at("busbw_gbps").get<double>(), 0) << line;
    sizes_by_op[row.at("op").get<std::string>()].insert(row.at("bytes").get<int64_t>());
  }
  // 4K, 16K, 64K for each of the four collectives and send/recv.
  EXPECT_EQ(line_count, 15) << result.out;
  const std::set<int64_t> expected_sizes = {4 << 10, 16 << 10, 64 << 10};
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv"}) {
    EXPECT_EQ(sizes_by_op[op], expected_sizes) << op << " missing sizes in:\n" << result.out;
  }
}

TEST(BenchComm, RejectsSharedBuffersWithoutShm) {
  const Output result = run_brigade({"bench", "comm", "--backend", "gloo", "--shared"});
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.err.find("--backend shm"), std::string::npos) << result.err;
}

// Sets the variables for the test's lifetime and restores them after, so the
// other tests of this binary see the environment they started with.
class ScopedEnv {
 public:
  void set(const char* name, const char* value) {
    remember(name);
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  void remember(const char* name) {
    if (saved_.count(name) != 0) return;
    const char* old = std::getenv(name);
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

constexpr const char* kLaunchVariables[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",         "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "BRIGADE_STORE_TOKEN"};

TEST(ConnectWorld, MissingEnvironmentSaysToUseTheLauncher) {
  ScopedEnv env;
  for (const char* name : kLaunchVariables) env.set(name, nullptr);
  for (const char* backend : {"shm", "gloo"}) {
    try {
      brigade::connect_world(backend, 1000);
      ADD_FAILURE() << backend << ": connect_world succeeded without the launcher's variables";
    } catch (const brigade::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("RANK"), std::string::npos) << message;
      EXPECT_NE(message.find("brigade launch"), std::string::npos) << message;
    }
  }
}

TEST(ConnectWorld, ShmAcrossNodesNamesTheFix) {
  ScopedEnv env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "0");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "1");
  env.set("BRIGADE_STORE_TOKEN", "0123456789abcdef0123456789abcdef");
  try {
    brigade::connect_world("shm", 1000);
    ADD_FAILURE() << "shm accepted a job spanning two nodes";
  } catch (const brigade::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--backend gloo"), std::string::npos) << e.what();
  }
}

TEST(ConnectWorld, SegmentNameIsStableAndHidesTheToken) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string name = brigade::shm_segment_name(token, "world");
  EXPECT_EQ(name, brigade::shm_segment_name(token, "world"));
  EXPECT_NE(name, brigade::shm_segment_name(token + "x", "world"));
  EXPECT_EQ(name.rfind("/brigade-", 0), 0u) << name;
  EXPECT_EQ(name.find(token.substr(0, 8)), std::string::npos) << name;
  EXPECT_EQ(name.size(), std::string("/brigade-").size() + 16 + std::string("-world").size());
}

}  // namespace

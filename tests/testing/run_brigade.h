// Runs the brigade binary under test as a child process and collects its
// exit status and output: for tests of whole commands.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

namespace brigade::testing {

// A model small enough that a CLI test trains it for 20 steps on several
// workers in about a second; tests append their [train], [data], ... sections.
inline constexpr char kTinyModelToml[] = R"([model]
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
vocab_size = 64
)";

inline const char* const kBrigade = BRIGADE_BINARY_DIR "/brigade";

struct Output {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// Runs the binary with both pipes drained as it goes (a full pipe would stall
// it) and kills it past timeout.
inline Output run_brigade(const std::vector<std::string>& args,
                          std::chrono::seconds timeout = std::chrono::seconds(60)) {
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
  const auto deadline = std::chrono::steady_clock::now() + timeout;
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

// A command's one-line output without its trailing spaces and newlines.
inline std::string trimmed(const std::string& text) {
  return text.substr(0, text.find_last_not_of(" \n") + 1);
}

// How often `what` occurs in `text`.
inline int occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace brigade::testing

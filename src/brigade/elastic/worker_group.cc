#include "brigade/elastic/worker_group.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/signals.h"

extern char** environ;

namespace brigade::elastic {
namespace {

// Writes a fixed message from a forked child, where only async-signal-safe
// calls are allowed.
void child_write(const std::string& text) {
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

// Forks and execs one worker. Everything the child needs is prepared here,
// because between fork and exec it may only make async-signal-safe calls.
pid_t spawn_worker(const Program& program, const Environment& worker_env,
                   const sigset_t& child_mask, int inherit_fd) {
  std::vector<std::string> entries, argv = program.argv;
  std::vector<char*> envp;
  worker_env.materialize(&entries, &envp);
  std::vector<char*> argvp = argv_pointers(argv);
  const std::string exec_failed = fmt::format("brigade launch: cannot run {}\n", program.path);
  const pid_t parent = ::getpid();
  std::fflush(nullptr);  // or the child could flush the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // the agent died before prctl
    ::pthread_sigmask(SIG_SETMASK, &child_mask, nullptr);
    // The agent keeps its descriptors close-on-exec; this one is meant for
    // the workers of this generation only.
    if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
    ::execve(program.path.c_str(), argvp.data(), envp.data());
    child_write(exec_failed);
    ::_exit(127);
  }
  // Also set in the parent: either may run first, and the agent signals
  // the group right away if it has to.
  if (pid > 0) ::setpgid(pid, pid);
  return pid;
}

}  // namespace

Environment::Environment() {
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string_view::npos)
      vars_[std::string(entry.substr(0, eq))] = entry.substr(eq + 1);
  }
}

void Environment::materialize(std::vector<std::string>* entries, std::vector<char*>* envp) const {
  entries->clear();
  for (const auto& [name, value] : vars_) entries->push_back(name + "=" + value);
  envp->clear();
  for (std::string& e : *entries) envp->push_back(e.data());
  envp->push_back(nullptr);
}

std::string worker_glibc_tunables(const std::string& user) {
  // GLIBC_TUNABLES is a colon-separated list of name=value.
  if (fmt::format(":{}", user).find(":glibc.malloc.tcache_count=") != std::string::npos) {
    return user;
  }
  return fmt::format("{}{}glibc.malloc.tcache_count=0", user, user.empty() ? "" : ":");
}

std::vector<char*> argv_pointers(std::vector<std::string>& argv) {
  std::vector<char*> pointers;
  for (std::string& a : argv) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  return pointers;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_exit(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return fmt::format("was killed by {}", signal_name(WTERMSIG(wait_status)));
  }
  return "stopped";
}

sigset_t watched_signals() {
  sigset_t set;
  ::sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaddset(&set, sig);
  return set;
}

BlockedSignals::BlockedSignals() {
  // SIGCHLD ignored (inherited from a parent) would make the kernel reap
  // workers itself and hide their exit statuses.
  ::signal(SIGCHLD, SIG_DFL);
  const sigset_t set = watched_signals();
  ::pthread_sigmask(SIG_BLOCK, &set, &previous_);
  // The quiet thread would otherwise take them first (core/signals.h).
  block_on_quiet_thread(set);
  child_mask_ = signals_on_a_quiet_thread() ? startup_signal_mask() : previous_;
}

BlockedSignals::~BlockedSignals() {
  const sigset_t set = watched_signals();
  const timespec zero{0, 0};
  while (::sigtimedwait(&set, nullptr, &zero) > 0) {
  }
  ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  unblock_on_quiet_thread(set);
}

bool WorkerExit::failed() const {
  return !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0;
}

WorkerGroup::WorkerGroup(const Program& program, Environment env, int first_rank, int count,
                         const sigset_t& child_mask, int inherit_fd) {
  workers_.resize(static_cast<size_t>(count));
  for (int local_rank = 0; local_rank < count; ++local_rank) {
    Worker& w = workers_[static_cast<size_t>(local_rank)];
    w.local_rank = local_rank;
    w.rank = first_rank + local_rank;
    env.set("RANK", std::to_string(w.rank));
    env.set("LOCAL_RANK", std::to_string(local_rank));
    w.pid = spawn_worker(program, env, child_mask, inherit_fd);
    if (w.pid < 0) {
      const int err = errno;
      kill_and_reap();
      throw_error("cannot start worker rank {}: fork failed: {}", w.rank, std::strerror(err));
    }
    w.running = true;
  }
}

WorkerGroup::~WorkerGroup() {
  kill_and_reap();
}

int WorkerGroup::running() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

std::vector<WorkerExit> WorkerGroup::reap() {
  std::vector<WorkerExit> exits;
  for (Worker& w : workers_) {
    if (!w.running) continue;
    int wait_status = 0;
    pid_t pid = 0;
    do {
      pid = ::waitpid(w.pid, &wait_status, WNOHANG);
    } while (pid < 0 && errno == EINTR);
    if (pid == 0) continue;
    w.running = false;
    if (pid < 0) continue;  // ECHILD: not ours to wait for any more, whatever we believed
    const WorkerExit ended{w, wait_status};
    if (ended.failed() || stopping_) ::kill(-w.pid, SIGKILL);
    exits.push_back(ended);
  }
  return exits;
}

void WorkerGroup::stop(int sig, int64_t grace_ms) {
  const int64_t kill_at = now_ns() + grace_ms * kNsPerMs;
  if (!stopping_ || kill_at < kill_at_ns_) kill_at_ns_ = kill_at;
  stopping_ = true;
  for (const Worker& w : workers_) {
    if (!w.running) continue;
    ::kill(-w.pid, sig);
    // A stopped worker (a SIGSTOP, the chaos mode's among them) cannot act
    // on `sig` until continued: without this the stop would wait the whole
    // grace for it, and the others, meanwhile, for it in a collective.
    if (sig != SIGKILL) ::kill(-w.pid, SIGCONT);
  }
  if (sig == SIGKILL) killed_ = true;
  enforce_grace();
}

int64_t WorkerGroup::ms_until_kill(int64_t cap_ms) const {
  if (!stopping_ || killed_) return cap_ms;
  return std::clamp<int64_t>((kill_at_ns_ - now_ns()) / kNsPerMs, 0, cap_ms);
}

void WorkerGroup::enforce_grace() {
  if (!stopping_ || killed_ || now_ns() < kill_at_ns_) return;
  for (const Worker& w : workers_) {
    if (w.running) ::kill(-w.pid, SIGKILL);
  }
  killed_ = true;
}

bool WorkerGroup::exited_unreaped(pid_t pid) {
  siginfo_t info{};
  int rc = 0;
  while ((rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT)) < 0 &&
         errno == EINTR) {
  }
  // si_pid stays 0 while the child runs; ECHILD: not ours to wait for.
  return rc < 0 || info.si_pid == pid;
}

void WorkerGroup::kill_and_reap() {
  for (Worker& w : workers_) {
    if (!w.running) continue;
    ::kill(-w.pid, SIGKILL);
    ::kill(w.pid, SIGKILL);  // should setpgid not have happened yet
    while (::waitpid(w.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    w.running = false;
  }
  stopping_ = true;
  killed_ = true;
}

}  // namespace brigade::elastic

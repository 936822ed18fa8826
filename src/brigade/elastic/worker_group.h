// WorkerGroup: the worker processes of one generation on one node, started
// together, watched by pid, and stopped together.
//
// Each worker runs in its own process group, so whatever it starts is
// stopped with it, and dies with its parent (PR_SET_PDEATHSIG) should the
// agent itself be killed. A group never outlives its object: the destructor
// SIGKILLs and reaps whatever still runs, so no worker of an old generation
// can be left to meet the next one.
//
// The agent handles SIGCHLD, SIGINT, SIGTERM and SIGHUP by waiting for them
// (sigtimedwait), so they are blocked while workers run (BlockedSignals);
// workers start with the mask the agent had before.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace brigade::elastic {

// What execve runs: the resolved path and argv (argv[0] as the user wrote it).
struct Program {
  std::string path;
  std::vector<std::string> argv;
};

// This process's environment plus the variables of one worker.
class Environment {
 public:
  Environment();  // a copy of this process's environment
  void set(const std::string& name, const std::string& value) { vars_[name] = value; }
  void set_default(const std::string& name, const std::string& value) {
    vars_.emplace(name, value);
  }
  void unset(const std::string& name) { vars_.erase(name); }
  // The variable's value, or nullptr if it is not set.
  const std::string* get(const std::string& name) const {
    const auto it = vars_.find(name);
    return it == vars_.end() ? nullptr : &it->second;
  }
  // NAME=VALUE strings and the null-terminated pointer array execve wants;
  // `envp` points into `entries`.
  void materialize(std::vector<std::string>* entries, std::vector<char*>* envp) const;

 private:
  std::map<std::string, std::string> vars_;
};

// GLIBC_TUNABLES for a worker: the user's (`user`, empty if unset) with
// glibc's per-thread malloc cache (tcache) turned off, unless the user set
// its size. Under glibc 2.36 (Debian 12) a pipeline stage's heap grew ~9 MB
// a step with the cache on (tiny, pp 2: peak RSS 142 -> 441 MB in 33 steps;
// malloc_stats later: 450 MB held, 10 MB in use), every new page a fault;
// off, it stays flat. The likely cause: oneDNN's page-aligned scratch on
// every GEMM (posix_memalign), whose cut-off pieces sit in the cache marked
// in use and pin the heap, the cache kept draining by send/recv records
// that another thread frees (docs/ARCHITECTURE.md, "Threads").
std::string worker_glibc_tunables(const std::string& user);

// argv's strings as the null-terminated array execve wants.
std::vector<char*> argv_pointers(std::vector<std::string>& argv);

// "SIGKILL", or "signal 40" for one without a name.
std::string signal_name(int sig);
// "exited with status 3", "was killed by SIGKILL".
std::string describe_exit(int wait_status);

// The signals the agent waits for while workers run.
sigset_t watched_signals();

// Blocks the watched signals for its lifetime, so none is lost or acted on
// before sigtimedwait collects it; on the way out drops those that came
// after the last worker ended (nobody is left to stop).
class BlockedSignals {
 public:
  BlockedSignals();
  ~BlockedSignals();
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;
  // What workers start with: the mask this process started with (the
  // agent's own threads block more, core/signals.h).
  const sigset_t& child_mask() const { return child_mask_; }

 private:
  sigset_t previous_, child_mask_;
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also its process group
  bool running = false;
};

struct WorkerExit {
  Worker worker;
  int wait_status = 0;
  bool failed() const;  // a non-zero status or a signal
};

class WorkerGroup {
 public:
  // Starts `count` workers with ranks first_rank.. and local ranks 0..; each
  // gets `env` plus RANK and LOCAL_RANK. `inherit_fd` (>= 0) stays open in
  // the workers (the heartbeat table). Throws Error, after killing those
  // already started, if a fork fails.
  WorkerGroup(const Program& program, Environment env, int first_rank, int count,
              const sigset_t& child_mask, int inherit_fd = -1);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  const std::vector<Worker>& workers() const { return workers_; }
  int running() const;

  // The workers that exited since the last call (never blocks). A worker's
  // process group is SIGKILLed when it fails or once the group is stopping:
  // what it started is of no use without it.
  std::vector<WorkerExit> reap();

  // Sends `sig` to every running worker's process group, and SIGKILL once
  // grace_ms has passed (see enforce_grace), and SIGCONT after `sig`, so
  // that a stopped worker acts on it. A later call only shortens the grace.
  // stop(SIGKILL, 0) kills at once.
  void stop(int sig, int64_t grace_ms);
  bool stopping() const { return stopping_; }
  // How long the caller may sleep before enforce_grace has work (capped by `cap_ms`).
  int64_t ms_until_kill(int64_t cap_ms) const;
  void enforce_grace();

  // SIGKILLs every running worker and waits for each.
  void kill_and_reap();

  // Whether worker `pid` exited though reap() has not collected it yet; it
  // stays for reap() to collect.
  static bool exited_unreaped(pid_t pid);

 private:
  std::vector<Worker> workers_;
  bool stopping_ = false;
  bool killed_ = false;
  int64_t kill_at_ns_ = 0;
};

}  // namespace brigade::elastic

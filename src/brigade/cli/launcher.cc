// Over 600 lines: `brigade launch` from flags to exit status in one place
// (validation, rendezvous, the workers' environment, the agent and the end
// of the job); the pieces that stand alone are in launch_nodes.cc,
// launch_snapshots.cc and rdzv_backend.cc.
#include "brigade/cli/launcher.h"

#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "brigade/cli/launch_nodes.h"
#include "brigade/cli/launch_snapshots.h"
#include "brigade/cli/rdzv_backend.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/signals.h"
#include "brigade/diag/incident_trace.h"
#include "brigade/diag/metrics_server.h"
#include "brigade/diag/prometheus.h"
#include "brigade/diag/root_cause.h"
#include "brigade/diag/trace_incidents.h"
#include "brigade/elastic/agent.h"
#include "brigade/elastic/snapshot_sync.h"
#include "brigade/elastic/worker_group.h"

extern char** environ;

namespace brigade::cli {
namespace {

using elastic::argv_pointers;
using elastic::Environment;
using elastic::Program;
using elastic::watched_signals;

// Verbs that run with this same binary rather than a program from PATH.
constexpr std::array<std::string_view, 6> kBrigadeVerbs = {"train", "eval",      "sample",
                                                           "bench", "tokenizer", "data"};
// How often node 0 looks for the other nodes' done keys (and a signal) at the end.
constexpr int64_t kDoneCheckMs = 500;
// How long a launcher stopped by a signal marks the run's traces at most
// (diag/trace_incidents.h: some 30 MiB of trace).
constexpr std::chrono::seconds kMarkingAfterSignal{3};

// Store keys the launchers of one job share.
const std::string kNodesJoinedKey = "brigade/launch/nodes_joined";
std::string node_key(int node_rank) {
  return fmt::format("brigade/launch/node/{}", node_rank);
}
std::string claim_key(int node_rank) {
  return fmt::format("brigade/launch/node/{}/claims", node_rank);
}
std::string done_key(int node_rank) {
  return fmt::format("brigade/launch/node/{}/done", node_rank);
}
std::string restarts_key(int node_rank) {
  return fmt::format("brigade/launch/node/{}/max_restarts", node_rank);
}
// Each call of the coordinator's own store client gives up after this long:
// a node cut off the network must notice within seconds, not after the
// rendezvous timeout, and the store answers a healthy client in well under
// a millisecond. At most half the silence that makes an agent lost (the
// coordinator refuses more): a slow call must not make a node look lost.
constexpr int64_t kCoordinatorCallTimeoutMs = elastic::CoordinatorOptions{}.agent_timeout_ms / 2;

// ------------------------------------------------------------------ options

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

HostPort parse_host_port(const std::string& text, bool allow_port_0) {
  const size_t colon = text.rfind(':');
  auto fail = [&] {
    throw_error("--rdzv wants HOST:PORT (for example node0:29500), got '{}'", text);
  };
  if (colon == std::string::npos || colon == 0) fail();
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = text.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    fail();
  }
  const int port = std::stoi(port_text);
  if (port > 65535 || (port == 0 && !allow_port_0)) fail();
  return {host, static_cast<uint16_t>(port)};
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int env_int(const char* name) {
  const std::string text = env(name).value_or("");
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 0 || value > (1 << 30)) {
    throw_error("{} should be a non-negative integer, got '{}'", name, text);
  }
  return static_cast<int>(value);
}

// 128 random bits as 32 hex digits.
std::string random_token() {
  unsigned char bytes[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  size_t got = 0;
  while (fd >= 0 && got < sizeof(bytes)) {
    const ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  if (fd >= 0) ::close(fd);
  if (got != sizeof(bytes)) throw_error("cannot read /dev/urandom to make the job's token");
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

const char* const kTokenHelp =
    "set BRIGADE_RDZV_TOKEN to the same secret on every node (for example export "
    "BRIGADE_RDZV_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')), or pass --rdzv-token";

// --rdzv-token, else BRIGADE_RDZV_TOKEN, else a fresh one where no other
// process needs to know it in advance.
std::string resolve_token(const LaunchOptions& o, bool may_generate, const char* situation) {
  if (!o.rdzv_token.empty()) return o.rdzv_token;
  if (auto token = env("BRIGADE_RDZV_TOKEN"); token && !token->empty()) return *token;
  if (may_generate) return random_token();
  throw_error("{} needs the job's rendezvous token: {}", situation, kTokenHelp);
}

// CPUs this process may run on (its affinity mask, which cgroups and
// schedulers such as Slurm narrow), not all CPUs of the machine.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

// True if every address `host` resolves to is a loopback address: then the
// store listens only there; otherwise on every interface, since a hostname
// often resolves to an address other nodes cannot reach (127.0.1.1).
bool is_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* head = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &head) != 0) return false;
  bool all_loopback = head != nullptr;
  for (addrinfo* a = head; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all_loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all_loopback &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) != 0;
    } else {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(head);
  return all_loopback;
}

// ------------------------------------------------------------------ program

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Finds the program in the launcher, so a typo is one clear error before any
// worker starts rather than N failed workers.
Program resolve_program(const std::vector<std::string>& command) {
  if (command.empty()) throw_error("brigade launch needs a command after --");
  const std::string& name = command[0];
  if (std::find(kBrigadeVerbs.begin(), kBrigadeVerbs.end(), name) != kBrigadeVerbs.end()) {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
      throw_error("cannot find the brigade binary (/proc/self/exe): {}", std::strerror(errno));
    Program program{std::string(self, static_cast<size_t>(n)), {}};
    program.argv.push_back(program.path);
    program.argv.insert(program.argv.end(), command.begin(), command.end());
    return program;
  }
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) throw_error("cannot run '{}': not an executable file", name);
    return {name, command};
  }
  const std::string path = env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    if (is_executable_file(candidate)) return {candidate, command};
    start = end + 1;
  }
  throw_error(
      "cannot find '{}' on PATH: give its path, or a brigade verb (train, eval, sample, "
      "bench, tokenizer, data)",
      name);
}

// ------------------------------------------------------------------ slurm

// Slurm's compact tasks-per-node list ("4(x2),3" = 4, 4, 3), one count per
// node of the step.
std::vector<int> tasks_per_node(const std::string& name, const std::string& spec) {
  std::vector<int> counts;
  try {
    size_t at = 0;
    while (at < spec.size()) {
      size_t used = 0;
      const int count = std::stoi(spec.substr(at), &used);
      at += used;
      int repeat = 1;
      if (spec.compare(at, 2, "(x") == 0) {
        at += 2;
        repeat = std::stoi(spec.substr(at), &used);
        at += used + 1;  // the number and ')'
      }
      for (int i = 0; i < repeat && counts.size() < 100000; ++i) counts.push_back(count);
      if (at < spec.size() && spec[at] == ',') ++at;
    }
  } catch (const std::logic_error&) {
    counts.clear();
  }
  if (counts.empty()) throw_error("cannot read {}='{}'", name, spec);
  return counts;
}

// The step's value of a Slurm variable: srun sets SLURM_STEP_* for the step
// it runs, while the plain names may still describe the whole allocation.
std::optional<std::pair<const char*, std::string>> step_env(const char* step_name,
                                                            const char* job_name) {
  if (auto value = env(step_name)) return std::make_pair(step_name, *value);
  if (auto value = env(job_name)) return std::make_pair(job_name, *value);
  return std::nullopt;
}

// A task srun started has SLURM_STEP_ID; Slurm's batch script (and salloc's
// shell) has SLURM_PROCID=0 and the whole job's SLURM_NTASKS too, but it is
// one process, not task 0 of the job: treating it as one would wait for
// tasks that never come.
bool in_srun_task() {
  return env("SLURM_PROCID") && env("SLURM_NTASKS") &&
         (env("SLURM_STEP_ID") || env("SLURM_STEPID"));
}

// --iface, checked before the rendezvous, so that a typo is one error at once
// rather than one per worker inside Gloo after the other nodes have joined.
void check_interface(const LaunchOptions& o) {
  if (!o.iface.empty() && ::if_nametoindex(o.iface.c_str()) == 0) {
    throw_error(
        "--iface {}: this node has no network interface of that name; `ip -brief address` "
        "lists them (pick the one on the network the other nodes are on)",
        o.iface);
  }
}

void set_interface(const LaunchOptions& o, Environment& worker_env) {
  if (!o.iface.empty()) worker_env.set("GLOO_SOCKET_IFNAME", o.iface);
}

// glibc's malloc cache off in Brigade's own workers (elastic::worker_glibc_tunables
// says why); another program launched (`brigade launch -- python ...`) keeps
// the environment it was given.
void set_malloc_tunables(const Program& program, Environment& worker_env) {
  std::error_code error;
  if (!std::filesystem::equivalent(program.path, "/proc/self/exe", error)) return;
  const std::string* user = worker_env.get("GLIBC_TUNABLES");
  worker_env.set("GLIBC_TUNABLES", elastic::worker_glibc_tunables(user ? *user : ""));
}

[[noreturn]] void exec_slurm_task(const LaunchOptions& o) {
  check_interface(o);
  const int rank = env_int("SLURM_PROCID");
  const int world_size =
      env("SLURM_STEP_NUM_TASKS") ? env_int("SLURM_STEP_NUM_TASKS") : env_int("SLURM_NTASKS");
  const int local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID") : 0;
  const int node_rank = env("SLURM_NODEID") ? env_int("SLURM_NODEID") : 0;
  // Brigade numbers ranks node by node, the same number on every node
  // (RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK): the hierarchical
  // backend finds a rank's node and its node's leader from that alone.
  // Slurm's cyclic distribution, or uneven nodes, would put a rank in
  // another node's shared-memory group; refused here, on every task, rather
  // than a hang in the first collective.
  const char* const kLayoutFix =
      "give srun --ntasks-per-node=N (N workers on every node) and the default block "
      "distribution (--distribution=block), or run one `brigade launch --nproc-per-node N` "
      "per node (srun --ntasks-per-node=1)";
  int local_world_size = 1;
  if (auto spec = step_env("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")) {
    const std::vector<int> counts = tasks_per_node(spec->first, spec->second);
    for (const int count : counts) {
      if (count != counts[0]) {
        throw_error("srun put different numbers of tasks on the nodes ({}={}): {}", spec->first,
                    spec->second, kLayoutFix);
      }
    }
    local_world_size = counts[0];
  } else if (env("SLURM_NTASKS_PER_NODE")) {
    local_world_size = env_int("SLURM_NTASKS_PER_NODE");
  }
  if (local_world_size < 1 || world_size % local_world_size != 0 ||
      local_rank >= local_world_size || rank != node_rank * local_world_size + local_rank) {
    throw_error(
        "srun task {} of {} is task {} of {} on node {}, which is not Brigade's numbering (node by "
        "node: rank = node * tasks per node + local rank): {}",
        rank, world_size, local_rank, local_world_size, node_rank, kLayoutFix);
  }
  HostPort master;
  if (!o.rdzv.empty()) {
    master = parse_host_port(o.rdzv, /*allow_port_0=*/false);
  } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    master = parse_host_port(*env("MASTER_ADDR") + ":" + *env("MASTER_PORT"), false);
  } else {
    throw_error(
        "under srun, pass --rdzv HOST:PORT (a port on the node of rank 0, for example the first "
        "host of $SLURM_JOB_NODELIST) or set MASTER_ADDR and MASTER_PORT");
  }
  const std::string token = resolve_token(o, /*may_generate=*/false, "every srun task");
  const Program program = resolve_program(o.command);

  Environment worker_env;
  worker_env.set("RANK", std::to_string(rank));
  worker_env.set("WORLD_SIZE", std::to_string(world_size));
  worker_env.set("LOCAL_RANK", std::to_string(local_rank));
  worker_env.set("LOCAL_WORLD_SIZE", std::to_string(local_world_size));
  worker_env.set("GROUP_RANK", std::to_string(node_rank));
  worker_env.set("BRIGADE_NODE", std::to_string(node_rank));
  worker_env.set("MASTER_ADDR", master.host);
  worker_env.set("MASTER_PORT", std::to_string(master.port));
  worker_env.set("BRIGADE_STORE_TOKEN", token);
  worker_env.set("BRIGADE_STORE_OWNER", "rank0");
  set_interface(o, worker_env);
  set_malloc_tunables(program, worker_env);
  // Slurm may already have bound this task to its own CPUs; then its
  // affinity mask is its share and is not divided again.
  const int threads = env("SLURM_CPUS_PER_TASK") ? env_int("SLURM_CPUS_PER_TASK")
                                                 : usable_cpus() / std::max(1, local_world_size);
  worker_env.set_default("OMP_NUM_THREADS", std::to_string(std::max(1, threads)));

  std::vector<std::string> entries, argv = program.argv;
  std::vector<char*> envp;
  worker_env.materialize(&entries, &envp);
  std::fflush(nullptr);
  {
    const StartupMaskForChildren child_mask;
    ::execve(program.path.c_str(), argv_pointers(argv).data(), envp.data());
  }
  throw_error("cannot run '{}': {}", program.path, std::strerror(errno));
}

// ------------------------------------------------------------------ rendezvous

// Claims this node's rank in the store and waits until every node has, so
// all of them start their workers knowing the whole job is there.
void join_nodes(TcpStore& store, const LaunchOptions& o) {
  if (store.add(claim_key(o.node_rank), 1) != 1) {
    throw_error(
        "another launcher already joined the rendezvous at {} as node rank {}: give each node "
        "its own --node-rank in 0..{}",
        store.address(), o.node_rank, o.nnodes - 1);
  }
  store.set(restarts_key(o.node_rank), std::to_string(o.max_restarts));
  store.set(nnodes_key(o.node_rank), nnodes_text(o));
  store.set(node_key(o.node_rank), std::to_string(o.nproc_per_node));
  store.add(kNodesJoinedKey, 1);
  std::vector<std::string> keys;
  for (int r = 0; r < o.nnodes; ++r) keys.push_back(node_key(r));
  try {
    store.wait(keys, o.rdzv_timeout_ms);
  } catch (const StoreTimeoutError&) {
    std::string missing;
    for (int r = 0; r < o.nnodes; ++r) {
      if (!store.check({node_key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw_error(
        "only {} of {} nodes joined the rendezvous at {} within {} ms (missing node ranks: {}): "
        "start `brigade launch --nnodes {} --node-rank R --rdzv {}` on every node",
        store.add(kNodesJoinedKey, 0), o.nnodes, store.address(), o.rdzv_timeout_ms, missing,
        o.nnodes, store.address());
  }
  for (int r = 0; r < o.nnodes; ++r) {
    const std::string nproc = store.get(node_key(r));
    if (nproc != std::to_string(o.nproc_per_node)) {
      throw_error(
          "node {} runs {} workers but this node (rank {}) runs {}: give every node the same "
          "--nproc-per-node",
          r, nproc, o.node_rank, o.nproc_per_node);
    }
    // The coordinator counts restarts for the whole job, with node 0's
    // limit; a node told otherwise would stop its workers for good where
    // the others restart theirs.
    const std::string restarts = store.get(restarts_key(r));
    if (restarts != std::to_string(o.max_restarts)) {
      throw_error(
          "node {} was given --max-restarts {} but this node (rank {}) {}: give every node the "
          "same --max-restarts (restarts are counted for the whole job)",
          r, restarts, o.node_rank, o.max_restarts);
    }
    check_same_nnodes(store, o, r, fmt::format("this node (rank {})", o.node_rank));
  }
}

// Node 0 keeps the store up until every node's workers are done with it;
// gives up after the rendezvous timeout or on a signal.
// A node whose loss ended the job (lost_nodes) never reports.
void wait_for_other_nodes(TcpStore& store, const LaunchOptions& o,
                          const std::vector<int>& lost_nodes) {
  std::vector<std::string> keys;
  for (int r = 0; r < o.nnodes; ++r) {
    if (std::find(lost_nodes.begin(), lost_nodes.end(), r) == lost_nodes.end()) {
      keys.push_back(done_key(r));
    }
  }
  const sigset_t watched = watched_signals();
  const int64_t deadline_ns = now_ns() + o.rdzv_timeout_ms * kNsPerMs;
  while (now_ns() < deadline_ns) {
    try {
      store.wait(keys, kDoneCheckMs);
      return;
    } catch (const StoreTimeoutError&) {
    }
    const timespec zero{0, 0};
    const int sig = ::sigtimedwait(&watched, nullptr, &zero);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) return;
  }
  fmt::print(stderr,
             "brigade launch: not every node reported its workers done within {} ms; closing the "
             "rendezvous store anyway\n",
             o.rdzv_timeout_ms);
}

// Returns the interface a partition fault of this node takes down ("" if
// none strikes it): checked here, so that a refused node never joins.
std::string validate(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) {
    throw_error("pass --nproc-per-node N (the number of workers on this node), or run under srun");
  }
  if (o.nnodes < 1) throw_error("--nnodes must be at least 1, got {}", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw_error("--node-rank must be in 0..{} for --nnodes {}, got {}", o.nnodes - 1, o.nnodes,
                o.node_rank);
  }
  if (o.nnodes > 1 && o.rdzv.empty()) {
    throw_error("a launch over {} nodes needs --rdzv HOST:PORT, where node 0 hosts the store",
                o.nnodes);
  }
  if (o.standby && o.nnodes < 2) {
    throw_error(
        "--standby waits to replace a lost node other than node 0 (whose loss ends a tcp job): it "
        "needs --nnodes 2 or more (the job's nodes, standbys not counted) and --rdzv");
  }
  if (o.rdzv_timeout_ms <= 0) throw_error("--rdzv-timeout-s must be positive");
  check_rdzv_backend(o);
  if (o.max_restarts < 0) throw_error("--max-restarts must be 0 or more, got {}", o.max_restarts);
  if (o.step_timeout_ms < 1000) {
    throw_error("--step-timeout-s must be at least 1, got {} ms", o.step_timeout_ms);
  }
  check_interface(o);
  if (!o.node_id.empty()) elastic::check_node_id(o.node_id);
  if (o.metrics_address != "off" && o.metrics_address != "auto") {
    diag::parse_metrics_address(o.metrics_address);
  }
  check_standby_and_node_faults(o, /*srun_tasks=*/false);
  if (o.chaos && (o.chaos->partition || o.chaos->kill_agent) && o.nnodes < 2) {
    throw_error(
        "chaos kinds partition and kill-agent strike a whole node, and node 0 never draws them: "
        "they need brigade launch over 2 or more nodes (--nnodes 2 or more, --rdzv); this job has "
        "1 node, so drop them from kinds= (kinds=kill+stop)");
  }
  // A partition strikes its own node's interface: a chaos one any node but
  // node 0 (elastic/fault_injection.h), a node fault the node it names; a
  // standby may become any node.
  bool partitioned = o.chaos && o.chaos->partition && (o.standby || o.node_rank != 0);
  for (const elastic::NodeFault& f : o.node_faults) {
    partitioned = partitioned || (f.kind == elastic::NodeFault::Kind::kPartition &&
                                  (o.standby || f.node == o.node_rank));
  }
  if (!partitioned) return "";
  const HostPort master = parse_host_port(o.rdzv, /*allow_port_0=*/false);
  return partition_interface(o, master.host, master.port);
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  if (o.nproc_per_node == 0 && in_srun_task()) {
    check_standby_and_node_faults(o, /*srun_tasks=*/true);
    exec_slurm_task(o);
  }
  if (o.nproc_per_node == 0 && env("SLURM_JOB_ID")) {
    throw_error(
        "this is Slurm's batch script (or salloc's shell), not a task srun started: run `srun "
        "brigade launch -- ...` (one task per worker) or `srun --ntasks-per-node=1 brigade "
        "launch --nproc-per-node N --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID ...` (one "
        "launcher per node); examples/slurm/train.sbatch shows both");
  }
  const std::string partition_iface = validate(o);
  // Before the rendezvous too: a refused node never joins.
  const TrainLayoutOnAllNodes layout = check_fewer_nodes(o);
  const Program program = resolve_program(o.command);
  HostPort master{"127.0.0.1", 0};
  if (!o.rdzv.empty()) master = parse_host_port(o.rdzv, /*allow_port_0=*/o.nnodes == 1);
  const char* situation = o.nnodes > 1 ? "a launch over several nodes" : "node rank > 0";
  const std::string token = resolve_token(o, /*may_generate=*/o.nnodes == 1, situation);

  // With etcd, checked there before this node joins anything.
  CoordinatorBackend coordination(o, token, kCoordinatorCallTimeoutMs);
  std::optional<TcpStoreServer> server;
  // With etcd every node's: the one that leads a generation serves it.
  std::string worker_store;
  if (o.node_rank == 0 && !o.standby) {
    server.emplace(is_loopback(master.host) ? master.host : "", master.port, token);
    master.port = server->port();
    coordination.publish_worker_store(master.host, master.port);
    if (coordination.etcd()) worker_store = fmt::format("{}:{}", master.host, master.port);
  } else if (coordination.etcd()) {
    server.emplace(is_loopback(master.host) ? master.host : "", 0, token);
    worker_store = fmt::format("{}:{}", elastic::local_address_towards(master.host, master.port),
                               server->port());
  }
  TcpStore store(master.host, master.port, token, o.rdzv_timeout_ms);
  coordination.publish_run(store);  // node 0, before the others can see it joined
  if (o.standby) {
    join_as_standby(store, o);
  } else {
    join_nodes(store, o);
  }

  const int world_size = o.nnodes * o.nproc_per_node;
  Environment worker_env;
  worker_env.set("WORLD_SIZE", std::to_string(world_size));
  worker_env.set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  worker_env.set("GROUP_RANK", std::to_string(o.node_rank));
  worker_env.set("BRIGADE_NODE", std::to_string(o.node_rank));
  worker_env.set("MASTER_ADDR", master.host);
  worker_env.set("MASTER_PORT", std::to_string(master.port));
  worker_env.set("BRIGADE_STORE_TOKEN", token);
  worker_env.set("BRIGADE_STORE_OWNER", "launcher");
  set_interface(o, worker_env);
  set_malloc_tunables(program, worker_env);
  // More threads than cores, summed over the node's workers, costs more in
  // contention than it gains.
  worker_env.set_default("OMP_NUM_THREADS",
                         std::to_string(std::max(1, usable_cpus() / o.nproc_per_node)));
  // Tells `brigade train`'s workers that a chaos part of their inject spec
  // is this launcher's to raise (else they refuse it: nobody would).
  worker_env.set("BRIGADE_CHAOS", o.chaos ? "1" : "0");

  elastic::AgentOptions agent;
  agent.program = program;
  agent.environment = worker_env;
  agent.nproc_per_node = o.nproc_per_node;
  agent.nnodes = o.nnodes;
  agent.min_nnodes = o.min_nnodes;
  agent.train_dp = layout.dp;
  agent.train_grad_accum = layout.grad_accum;
  agent.node_rank = o.node_rank;
  agent.max_restarts = o.max_restarts;
  agent.brigade_train = o.command[0] == "train";
  agent.failure_grace_ms = o.failure_grace_ms;
  agent.watchdog.step_timeout_ms = o.step_timeout_ms;
  agent.chaos = o.chaos;
  agent.standby = o.standby;
  agent.node_id = o.node_id;
  agent.worker_store = worker_store;
  agent.node_faults = o.node_faults;
  agent.partition_iface = partition_iface;
  // The coordinator's calls get their own connection with a short timeout
  // (kCoordinatorCallTimeoutMs), through the same token check.
  if (o.nnodes > 1) agent.store = &coordination.open(store, master.host, master.port);
  agent.diagnose = [](const std::filesystem::path& dir) { return diag::diagnose_incident(dir); };
  diag::IncidentTimelines timelines;  // outlives the agent: its writes finish first
  agent.resolved = [&timelines](const std::filesystem::path& dir) { timelines.write(dir); };
  const LaunchSnapshots snapshots = set_up_snapshots(o, agent, master.host, master.port, token);
  int exit_status = 0;
  const int64_t launched_unix_us = unix_us_now();
  std::optional<std::pair<std::string, diag::LaunchTraces>> traces;
  bool signalled = false;
  {
    const elastic::BlockedSignals blocked;
    // Started with the signals blocked, so its thread never takes the
    // SIGTERM meant for the agent.
    elastic::Agent supervisor(std::move(agent));
    std::optional<diag::MetricsServer> metrics;
    const std::string metrics_address = o.metrics_address != "auto" ? o.metrics_address
                                        : o.command[0] == "train"   ? "127.0.0.1:0"
                                                                    : "off";
    if (metrics_address != "off") {
      metrics.emplace(diag::parse_metrics_address(metrics_address),
                      [&supervisor] { return diag::prometheus_text(supervisor.status()); });
      fmt::print(stderr, "brigade launch: metrics at {}\n", metrics->url());
      std::fflush(stderr);
    }
    exit_status = supervisor.run(blocked.child_mask());
    // The agent that wrote incidents.jsonl marks them in the traces this
    // launch's workers wrote without knowing of them: once the job ended
    // everywhere (below), with the signals back as usual.
    if (supervisor.writes_run_records()) {
      traces.emplace(supervisor.run_dir(),
                     diag::LaunchTraces{supervisor.generation(), launched_unix_us});
      signalled = supervisor.received_signal() != 0;
    }
    // An agent that lost the coordinator would wait out the store's
    // timeout to say it is done, to nobody.
    if (o.nnodes > 1 && !supervisor.lost_coordinator() && coordination.etcd()) {
      coordination.finish(supervisor.node_rank(), exit_status, supervisor.led(),
                          supervisor.nodes_out());
    } else if (o.nnodes > 1 && !supervisor.lost_coordinator()) {
      try {
        // A standby that took a node's place is that node now.
        const int node = supervisor.node_rank();
        if (node >= 0) store.set(done_key(node), std::to_string(exit_status));
        if (o.standby) standby_done(store, supervisor.standby_id());
        if (node == 0) {
          wait_for_other_nodes(store, o, supervisor.nodes_out());
          // Released by the agent's end: a waiting standby sees it within
          // a tick, a live one says so well within the silence allowed.
          wait_for_standbys(store, elastic::CoordinatorOptions{}.agent_timeout_ms);
        }
      } catch (const Error& e) {
        fmt::print(stderr, "brigade launch: {}\n", e.what());
      }
    }
  }
  if (traces) {
    // Stopped by a signal: whoever sent it waits for the launcher to go,
    // and a trace of gigabytes could hold it for a minute.
    if (signalled) {
      traces->second.out_of_time = [until =
                                        std::chrono::steady_clock::now() + kMarkingAfterSignal] {
        return std::chrono::steady_clock::now() >= until;
      };
    }
    for (const std::string& line : diag::mark_launch_traces(traces->first, traces->second)) {
      fmt::print(stderr, "brigade launch: {}\n", line);
    }
  }
  return exit_status;
}

}  // namespace brigade::cli

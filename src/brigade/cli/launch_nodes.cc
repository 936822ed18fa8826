#include "brigade/cli/launch_nodes.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "brigade/cli/load_config.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/standby.h"

namespace brigade::cli {
namespace {

std::string standby_done_key(int standby_id) {
  return fmt::format("brigade/launch/standby/{}/done", standby_id);
}

// The local IPv4 address this machine would reach host:port from (a UDP
// socket's connect sends nothing).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* head = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &head) != 0 || head == nullptr) {
    throw_error("cannot resolve the rendezvous host '{}' to an IPv4 address", host);
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  const bool ok = fd >= 0 && ::connect(fd, head->ai_addr, head->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int error = errno;
  ::freeaddrinfo(head);
  if (fd >= 0) ::close(fd);
  if (!ok) throw_error("no route to the rendezvous host {}: {}", host, std::strerror(error));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

void join_as_standby(TcpStore& store, const LaunchOptions& o) {
  const std::string node0 = "brigade/launch/node/0";
  const int64_t deadline_ns = now_ns() + o.rdzv_timeout_ms * 1'000'000;
  try {
    store.wait({node0}, o.rdzv_timeout_ms);
  } catch (const StoreTimeoutError&) {
    throw_error(
        "node 0 did not join the rendezvous at {} within {} ms: a standby waits for a job that "
        "runs; start node 0's `brigade launch --nnodes {} --node-rank 0` first",
        store.address(), o.rdzv_timeout_ms, o.nnodes);
  }
  const std::string nproc = store.get(node0);
  if (nproc != std::to_string(o.nproc_per_node)) {
    throw_error(
        "node 0 runs {} workers but this standby was given --nproc-per-node {}: a standby runs a "
        "lost node's workers, so give it the nodes' --nproc-per-node",
        nproc, o.nproc_per_node);
  }
  const std::string restarts = store.get("brigade/launch/node/0/max_restarts");
  if (restarts != std::to_string(o.max_restarts)) {
    throw_error(
        "node 0 was given --max-restarts {} but this standby {}: give it the same --max-restarts "
        "(restarts are counted for the whole job)",
        restarts, o.max_restarts);
  }
  check_same_nnodes(store, o, 0, "this standby");
  // Node 0's agent starts beating once every node joined: watched before,
  // its silence would look like the leader's loss.
  fmt::print(stderr, "brigade launch: standby waits for the job's {} nodes to join\n", o.nnodes);
  std::fflush(stderr);
  const std::string leader_beat = elastic::coordinator_key("agent/0/beat");
  const int64_t left_ms = std::max<int64_t>(1, (deadline_ns - now_ns()) / 1'000'000);
  try {
    store.wait({leader_beat}, left_ms);
  } catch (const StoreTimeoutError&) {
    throw_error(
        "the job's {} nodes did not all join the rendezvous at {} within {} ms (node 0's agent "
        "has not started): a standby waits for a job that runs; start every node's `brigade "
        "launch --nnodes {} --node-rank R`",
        o.nnodes, store.address(), o.rdzv_timeout_ms, o.nnodes);
  }
}

void standby_done(TcpStore& store, int standby_id) {
  store.set(standby_done_key(standby_id), "1");
}

void wait_for_standbys(TcpStore& store, int64_t limit_ms) {
  const std::string count_key = elastic::standby_count_key();
  if (!store.check({count_key})) return;
  const int64_t count = store.add(count_key, 0);
  std::vector<std::string> keys;
  for (int s = 0; s < count; ++s) keys.push_back(standby_done_key(s));
  if (keys.empty()) return;
  try {
    store.wait(keys, limit_ms);
  } catch (const StoreTimeoutError&) {
    fmt::print(stderr,
               "brigade launch: not every standby node said it is done within {} ms (a standby "
               "that died, or was taken off the network); closing the rendezvous store anyway\n",
               limit_ms);
  }
}

void check_standby_and_node_faults(const LaunchOptions& o, bool srun_tasks) {
  if (srun_tasks && (o.standby || !o.node_faults.empty() || o.min_nnodes != 0)) {
    throw_error(
        "--standby, --nnodes MIN:MAX and the kill-agent and partition faults need one launcher "
        "per node, whose "
        "agent follows the coordinator; under srun's one task per worker there is none: run "
        "`srun --ntasks-per-node=1 brigade launch --nproc-per-node N --nnodes $SLURM_NNODES "
        "--node-rank $SLURM_NODEID ...`");
  }
  if (o.standby && o.max_restarts == 0) {
    throw_error(
        "--standby takes a lost node's place in the job's next generation, which is a restart: "
        "give every node and the standby --max-restarts 1 or more");
  }
  for (const elastic::NodeFault& f : o.node_faults) {
    if (o.nnodes < 2) {
      throw_error(
          "--inject {}:node={} strikes a whole node of a job over several nodes: it needs "
          "--nnodes 2 or more (and a --standby node to take the struck node's place, or "
          "--nnodes MIN:MAX to go on without it)",
          f.name(), f.node);
    }
    // A hold only delays node 0's workers: node 0 may be held. With etcd
    // another node takes over from a lost node 0 (elastic/coordinator.h).
    if (f.node == 0 && f.kind != elastic::NodeFault::Kind::kHold && o.rdzv_backend != "etcd") {
      throw_error(
          "--inject {}:node=0 strikes node 0, which hosts the rendezvous store and leads the "
          "job: its loss ends the job, no standby can take its place (with --rdzv-backend etcd "
          "another node would lead); strike node 1..{}",
          f.name(), o.nnodes - 1);
    }
    if (f.node >= o.nnodes) {
      throw_error("--inject {}:node={} names no node of this job (--nnodes {}): strike node 1..{}",
                  f.name(), f.node, o.nnodes, o.nnodes - 1);
    }
  }
}

std::string nnodes_text(const LaunchOptions& o) {
  return fmt::format("{}:{}", o.min_nnodes == 0 ? o.nnodes : o.min_nnodes, o.nnodes);
}

std::string nnodes_key(int node_rank) {
  return fmt::format("brigade/launch/node/{}/nnodes", node_rank);
}

void check_same_nnodes(TcpStore& store, const LaunchOptions& o, int r, const std::string& who) {
  const std::string theirs = store.get(nnodes_key(r));
  if (theirs == nnodes_text(o)) return;
  throw_error(
      "node {} was given --nnodes {} but {} --nnodes {}: give every node and standby the same "
      "--nnodes MIN:MAX (the leader decides how few the job goes on with, and every node "
      "follows)",
      r, theirs, who, nnodes_text(o));
}

TrainLayoutOnAllNodes check_fewer_nodes(const LaunchOptions& o) {
  const int min = o.min_nnodes == 0 ? o.nnodes : o.min_nnodes;
  if (min < 1 || min > o.nnodes) {
    throw_error(
        "--nnodes {}:{}: the fewest nodes the job may go on with must be 1 to {} (its nodes); "
        "pass --nnodes MIN:MAX with 1 <= MIN <= MAX",
        min, o.nnodes, o.nnodes);
  }
  if (min == o.nnodes) return {};
  if (o.max_restarts == 0) {
    throw_error(
        "--nnodes {}:{} goes on with fewer nodes in the job's next generation, which is a "
        "restart: give every node --max-restarts 1 or more",
        min, o.nnodes);
  }
  if (o.command.empty() || o.command[0] != "train") return {};
  // `train CONFIG [--set K=V]...`: the options train takes with a value.
  std::string config_path;
  std::vector<std::string> overrides;
  for (size_t i = 1; i < o.command.size(); ++i) {
    const std::string& a = o.command[i];
    const bool valued = a == "--set" || a == "--resume" || a == "--nproc" ||
                        a == "--max-restarts" || a == "--inject" || a == "--metrics";
    if (valued && i + 1 < o.command.size()) {
      if (a == "--set") overrides.push_back(o.command[i + 1]);
      ++i;
    } else if (a.starts_with("--set=")) {
      overrides.push_back(a.substr(6));
    } else if (!a.starts_with("-") && config_path.empty()) {
      config_path = a;
    }
  }
  if (config_path.empty()) return {};  // train itself says what is missing
  Config config = load_config(config_path, overrides);
  const int64_t tp = config.get_int("parallel.tp", 1), pp = config.get_int("parallel.pp", 1);
  const int64_t world = static_cast<int64_t>(o.nnodes) * o.nproc_per_node;
  const int64_t dp = config.get_int("parallel.dp", world / std::max<int64_t>(1, tp * pp));
  const int64_t accum = config.get_int("train.grad_accum", 1);
  // Scaled below by division: train itself names the layout that does not fit.
  if (dp < 1) {
    throw_error(
        "--nnodes {}:{} scales parallel.dp with the nodes, but it is {} (parallel.tp {} x "
        "parallel.pp {} on {} workers): set parallel.dp to 1 or more, or fewer tp x pp",
        min, o.nnodes, dp, tp, pp, world);
  }
  if (accum < 1) {
    throw_error(
        "--nnodes {}:{} scales train.grad_accum with the nodes, but it is {}: set "
        "train.grad_accum to 1 or more",
        min, o.nnodes, accum);
  }
  for (int k = o.nnodes - 1; k >= min; --k) {
    const bool dp_whole = dp * k % o.nnodes == 0;
    if (dp_whole && dp * accum % (dp * k / o.nnodes) == 0) continue;
    throw_error(
        "--nnodes {}:{} lets the job go on with {} nodes, where the same global batch needs "
        "parallel.dp = {} x {} / {} and train.grad_accum = {} x {} / that dp, {}: pass --nnodes "
        "{}:{} (no node count from {} down is ever used), or choose a parallel.dp and "
        "train.grad_accum that scale to {} nodes",
        min, o.nnodes, k, dp, k, o.nnodes, accum, dp,
        dp_whole ? fmt::format("{} / {} is not whole", dp * accum, dp * k / o.nnodes)
                 : fmt::format("{} / {} is not whole", dp * k, o.nnodes),
        k + 1, o.nnodes, k, k);
  }
  return {static_cast<int>(dp), accum};
}

namespace {

// Whether this process runs in a network namespace of its own, not the
// machine's (pid 1's): only there may the partition fault take an
// interface down. Where pid 1's namespace cannot be read (no
// CAP_SYS_PTRACE, as in some containers), a namespace `ip netns add` named
// is one of its own. Returns "" or why not.
std::string why_not_own_network_namespace() {
  struct stat self {};
  if (::stat("/proc/self/ns/net", &self) != 0) {
    return fmt::format("cannot read /proc/self/ns/net ({})", std::strerror(errno));
  }
  struct stat init {};
  if (::stat("/proc/1/ns/net", &init) == 0) {
    if (init.st_ino != self.st_ino || init.st_dev != self.st_dev) return "";
    return "this process runs in the machine's own network namespace (pid 1's), where taking an "
           "interface down cuts the host's real network";
  }
  const std::string init_error = std::strerror(errno);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    struct stat named {};
    if (::stat(entry.path().c_str(), &named) == 0 && named.st_ino == self.st_ino &&
        named.st_dev == self.st_dev) {
      return "";
    }
  }
  return fmt::format(
      "cannot compare this process's network namespace with the machine's (/proc/1/ns/net: {}), "
      "and it is none that `ip netns add` named: it may be the host's real network",
      init_error);
}

}  // namespace

std::string partition_interface(const LaunchOptions& o, const std::string& store_host,
                                int store_port) {
  std::string name = o.iface;
  bool loopback = false;
  const std::string address =
      name.empty() ? local_address_towards(store_host, store_port) : std::string();
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) throw_error("cannot list the network interfaces");
  for (ifaddrs* a = head; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    if ((name.empty() && address == text) || (!name.empty() && name == a->ifa_name)) {
      name = a->ifa_name;
      loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
      break;
    }
  }
  ::freeifaddrs(head);
  if (name.empty()) {
    throw_error("no interface of this node holds {}, its address towards the rendezvous host {}",
                address, store_host);
  }
  if (loopback) {
    throw_error(
        "the partition fault would take down {}, a loopback interface (the nodes reach the "
        "rendezvous store {} over it): that cuts every node on this machine; run each node in "
        "its own network namespace (scripts/fake_cluster.sh), or give --iface",
        name, store_host);
  }
  if (::geteuid() != 0) {
    throw_error(
        "the partition fault takes this node's network interface down, which needs root "
        "(CAP_NET_ADMIN): run the node's launcher as root, inside its own network namespace "
        "(scripts/fake_cluster.sh)");
  }
  if (const std::string why = why_not_own_network_namespace(); !why.empty()) {
    throw_error(
        "refusing the partition fault: {}; run each node's launcher in its own network "
        "namespace (scripts/fake_cluster.sh), where taking {} down cuts that node only",
        why, name);
  }
  return name;
}

}  // namespace brigade::cli

// Multi-node jobs on real network namespaces (scripts/fake_cluster.sh): each
// node has only its own address on a bridge, and this machine's /etc/hosts
// may map its name to 127.0.0.1, as a stock host's often does. Needs root and
// `ip netns`; skipped otherwise.
//
// Each test brings up its own cluster under its own name and subnet, so they
// may run at once, and brings it down whatever happens (the Cluster
// destructor); `down` also stops whatever still runs on its nodes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/advertised_address.h"
#include "testing/fake_cluster.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The fake cluster's pieces (testing/fake_cluster.h).
using testing::Cluster;
using testing::finish;
using testing::read_all;
using testing::spawn;
using Result = testing::ClusterResult;

// Output of a shell command run here, in the root namespace.
std::string shell(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 6
[data]
synthetic = true
[parallel]
dp = 2
bucket_mb = 0.01
)";

// `brigade launch` of node `node` of two, one worker each, training `config`
// into run_dir; `launch_flags` go before the others.
std::vector<std::string> two_node_launch(int node, const std::string& rdzv, const fs::path& config,
                                         const fs::path& run_dir,
                                         std::vector<std::string> launch_flags = {}) {
  std::vector<std::string> args = {testing::kBrigade, "launch"};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  const std::vector<std::string> rest = {"--nproc-per-node",
                                         "1",
                                         "--nnodes",
                                         "2",
                                         "--node-rank",
                                         std::to_string(node),
                                         "--rdzv",
                                         rdzv,
                                         "--rdzv-token",
                                         "cluster-test",
                                         "--",
                                         "train",
                                         config.string(),
                                         "--set",
                                         "train.run_dir=\"" + run_dir.string() + "\""};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

// Scope 0 of issue 17: two nodes, one worker each, nothing telling Gloo which
// address to use. Listening on the host's name (127.0.0.1 here) fails to
// connect; the address each node reaches the store from works, and the job
// computes exactly what one node with two workers does.
TEST(MultiNodeCluster, TwoNamespaceNodesTrainLikeOneNodeWithoutAnyAddressSet) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgmn", "10.88.1", dir.path());
  const Result up = cluster.script({"up", "2"});
  ASSERT_EQ(up.status, 0) << up.output;

  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << kTraining;
  const fs::path two_nodes = dir.path() / "two_nodes";
  const std::string rdzv = cluster.address(0) + ":29511";
  auto launch = [&](int node) {
    return two_node_launch(node, rdzv, config, two_nodes, {"--rdzv-timeout-s", "60"});
  };

  const fs::path log0 = dir.path() / "node0.log", log1 = dir.path() / "node1.log";
  const pid_t node1 = cluster.start_on(1, launch(1), log1);
  const pid_t node0 = cluster.start_on(0, launch(0), log0);
  const Result r0 = finish(node0, log0, 120s);
  const Result r1 = finish(node1, log1, 120s);
  ASSERT_EQ(r0.status, 0) << "node 0:\n" << r0.output << "\nnode 1:\n" << r1.output;
  ASSERT_EQ(r1.status, 0) << "node 1:\n" << r1.output << "\nnode 0:\n" << r0.output;
  EXPECT_NE(r0.output.find("dp 2"), std::string::npos) << r0.output;

  const fs::path one_node = dir.path() / "one_node";
  const auto single = testing::run_brigade({"train", "--nproc", "2", config.string(), "--set",
                                            "train.run_dir=\"" + one_node.string() + "\""});
  ASSERT_EQ(single.status, 0) << single.err;
  const auto hash_two = testing::run_brigade({"ckpt", "hash", two_nodes.string()});
  const auto hash_one = testing::run_brigade({"ckpt", "hash", one_node.string()});
  ASSERT_EQ(hash_two.status, 0) << hash_two.err;
  ASSERT_EQ(hash_one.status, 0) << hash_one.err;
  EXPECT_EQ(hash_two.out, hash_one.out) << "two nodes and one node trained different parameters";
}

// Both nodes told to listen on loopback, which the other cannot reach: the
// job fails at once, and the error says what this rank advertised and how to
// choose another address.
TEST(MultiNodeCluster, UnreachableAddressIsNamedWithHowToChooseAnother) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgmf", "10.88.4", dir.path());
  const Result up = cluster.script({"up", "2"});
  ASSERT_EQ(up.status, 0) << up.output;
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << kTraining;
  auto launch = [&](int node) {
    return two_node_launch(node, cluster.address(0) + ":29511", config, dir.path() / "run",
                           {"--iface", "lo"});
  };

  const fs::path log0 = dir.path() / "node0.log", log1 = dir.path() / "node1.log";
  const pid_t node1 = cluster.start_on(1, launch(1), log1);
  const pid_t node0 = cluster.start_on(0, launch(0), log0);
  const Result r0 = finish(node0, log0, 120s);
  const Result r1 = finish(node1, log1, 120s);
  EXPECT_NE(r0.status, 0) << r0.output;
  EXPECT_NE(r1.status, 0) << r1.output;
  const std::string both = r0.output + r1.output;
  EXPECT_NE(both.find("This rank listens on [127.0.0.1]"), std::string::npos) << both;
  EXPECT_NE(both.find("(named by GLOO_SOCKET_IFNAME, which `brigade launch --iface` sets); if the "
                      "other nodes cannot reach it, name the interface they can with `brigade "
                      "launch --iface NAME` or GLOO_SOCKET_IFNAME=NAME"),
            std::string::npos)
      << both;
}

// Scope 4 of issue 17: node 1 has its own file system where the run
// directory should be (a tmpfs mounted over it in node 1's mount namespace,
// as a node-local disk would be). Rank 0 would wait at the first save for
// shards it can never see; instead both nodes stop at start, naming the rank
// that cannot see the directory and the fix, and nothing is left in it.
TEST(MultiNodeCluster, ARunDirectoryNotSharedByEveryNodeIsRefusedAtStart) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgms", "10.88.7", dir.path());
  const Result up = cluster.script({"up", "2"});
  ASSERT_EQ(up.status, 0) << up.output;
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << kTraining;
  const fs::path run = dir.path() / "run";
  fs::create_directories(run);
  const std::string rdzv = cluster.address(0) + ":29511";

  const fs::path log0 = dir.path() / "node0.log", log1 = dir.path() / "node1.log";
  // `ip netns exec` runs node 1's command in a mount namespace of its own:
  // the tmpfs is seen by node 1's processes only, and goes with them.
  std::vector<std::string> node1_command = {
      "/bin/sh", "-c", "mount -t tmpfs brigade-node1 \"$0\" && exec \"$@\"", run.string()};
  for (const std::string& a : two_node_launch(1, rdzv, config, run)) node1_command.push_back(a);
  const pid_t node1 = cluster.start_on(1, node1_command, log1);
  const pid_t node0 = cluster.start_on(0, two_node_launch(0, rdzv, config, run), log0);
  const Result r0 = finish(node0, log0, 120s);
  const Result r1 = finish(node1, log1, 120s);
  EXPECT_NE(r0.status, 0) << r0.output;
  EXPECT_NE(r1.status, 0) << r1.output;
  // Every rank finds it and says so, but only rank 0's line is certain to
  // be printed: once rank 0 has exited, node 1's agent stops rank 1, and on
  // a loaded machine that can come before rank 1 wrote its own line (seen
  // in CI). So node 0's log (rank 0's) must hold the line and its fix, and
  // node 1's the line or the named exit that ended its worker.
  const std::string line = "the run directory is not shared by every node: rank 1 cannot see " +
                           (run / "checkpoints").string();
  EXPECT_NE(r0.output.find(line), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("Put train.run_dir on a file system every node mounts"),
            std::string::npos)
      << r0.output;
  EXPECT_TRUE(r1.output.find(line) != std::string::npos ||
              r1.output.find("worker rank 0 (local 0, node 0) exited with status 1") !=
                  std::string::npos)
      << r1.output;
  for (const Result* r : {&r0, &r1}) {
    EXPECT_EQ(r->output.find("loss "), std::string::npos) << "trained before refusing";
  }
  // No probe and no checkpoint left in the shared directory.
  std::vector<std::string> left;
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    if (e.is_regular_file()) left.push_back(e.path().string());
  }
  EXPECT_TRUE(left.empty()) << left.front();
}

// Runs fn on a thread inside network namespace `netns`: setns moves only the
// calling thread, and sockets (netlink ones too) belong to the namespace of
// the thread that made them. False when the namespace cannot be entered.
template <typename Fn>
bool in_netns(const std::string& netns, Fn fn) {
  bool entered = false;
  std::thread([&] {
    const int ns = ::open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return;
    entered = ::setns(ns, CLONE_NEWNET) == 0;
    ::close(ns);
    if (entered) fn();
  }).join();
  return entered;
}

// A TCP listener on `address:port` inside namespace `netns`, or -1. The
// caller closes it.
int listen_in(const std::string& netns, const std::string& address, uint16_t port) {
  int fd = -1;
  in_netns(netns, [&] {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
    if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(s, 16) == 0) {
      fd = s;
    } else {
      ::close(s);
    }
  });
  return fd;
}

// The rule of comm/advertised_address.h on a node whose only interfaces are
// loopback and eth0: the store's connection decides, and loopback is kept only
// when the store's host was written as loopback (all nodes on one machine). A
// host name that resolves to loopback on this node (Debian's 127.0.1.1 for
// its own name) gives eth0's address instead.
TEST(MultiNodeCluster, AdvertisedAddressIsNeverLoopbackWhenPeersAreElsewhere) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgma", "10.88.5", dir.path());
  const Result up = cluster.script({"up", "1"});
  ASSERT_EQ(up.status, 0) << up.output;
  AdvertisedAddress routed, named, local, localhost;
  ASSERT_TRUE(in_netns(cluster.netns(0), [&] {
    routed = choose_advertised_address("10.88.5.99", "10.88.5.10");
    named = choose_advertised_address("node0", "127.0.1.1");
    local = choose_advertised_address("127.0.0.1", "127.0.0.1");
    localhost = choose_advertised_address("localhost", "127.0.0.1");
  }));
  EXPECT_EQ(routed.address, "10.88.5.10") << routed.reason;
  EXPECT_EQ(named.address, "10.88.5.10") << named.reason;
  EXPECT_NE(named.reason.find("node0"), std::string::npos) << named.reason;
  EXPECT_EQ(local.address, "127.0.0.1") << local.reason;
  EXPECT_EQ(localhost.address, "127.0.0.1") << localhost.reason;
  // Nothing but loopback: no peer can be elsewhere.
  ASSERT_EQ(cluster.script({"run", "0", "ip", "link", "set", "eth0", "down"}).status, 0);
  AdvertisedAddress alone;
  ASSERT_TRUE(
      in_netns(cluster.netns(0), [&] { alone = choose_advertised_address("node0", "127.0.1.1"); }));
  EXPECT_EQ(alone.address, "127.0.1.1") << alone.reason;
}

// `brigade bench comm` of all-reduce on 2 nodes x 2 workers; node 0's JSON
// rows keyed by size. Fails the test if either node fails (which includes a
// wrong result: bench comm checks every element of an all-reduce of exact
// sums before timing it).
std::map<int64_t, nlohmann::json> bench_all_reduce(Cluster& cluster, const fs::path& dir,
                                                   const std::string& backend, int port) {
  auto node_argv = [&](int node) {
    return std::vector<std::string>{testing::kBrigade,
                                    "bench",
                                    "comm",
                                    "--nproc",
                                    "2",
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(node),
                                    "--rdzv",
                                    cluster.address(0) + ":" + std::to_string(port),
                                    "--rdzv-token",
                                    "cluster-test",
                                    "--backend",
                                    backend,
                                    "--ops",
                                    "all_reduce",
                                    "--min-bytes",
                                    "256K",
                                    "--max-bytes",
                                    "4M",
                                    "--iters",
                                    "4",
                                    "--json"};
  };
  const fs::path log0 = dir / (backend + "0.log"), log1 = dir / (backend + "1.log");
  const pid_t node1 = cluster.start_on(1, node_argv(1), log1);
  const pid_t node0 = cluster.start_on(0, node_argv(0), log0);
  const Result r0 = finish(node0, log0, 180s);
  const Result r1 = finish(node1, log1, 180s);
  EXPECT_EQ(r0.status, 0) << backend << " node 0:\n" << r0.output << "\nnode 1:\n" << r1.output;
  EXPECT_EQ(r1.status, 0) << backend << " node 1:\n" << r1.output << "\nnode 0:\n" << r0.output;
  std::map<int64_t, nlohmann::json> rows;
  std::istringstream lines(r0.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{", 0) != 0) continue;
    const auto row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("op"), "all_reduce") << "--ops all_reduce ran another operation: " << line;
    rows[row.at("bytes").get<int64_t>()] = row;
  }
  return rows;
}

// Scope 3 of issue 17. Both backends give the exact sums (bench comm checks
// every element before timing; for sums that are not exact in f32 the two
// differ in the last bits, as they add in different orders). On the wire
// between the nodes, an all-reduce of S bytes over m = 2 nodes of k = 2
// workers costs flat Gloo's node-ordered ring m * 2(n-1)/n * S = 3 S (two of
// its four edges cross nodes) and the hierarchical backend's leader ring
// m * 2(m-1)/m * S = 2 S: only the leaders send, one copy per node. Measured
// with each node's transmit counters (headers and ACKs included: at most a
// few percent more).
TEST(MultiNodeCluster, HierarchicalAllReduceSendsOnlyTheLeadersCopyAcrossNodes) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgmh", "10.88.6", dir.path());
  const Result up = cluster.script({"up", "2"});
  ASSERT_EQ(up.status, 0) << up.output;
  const auto flat = bench_all_reduce(cluster, dir.path(), "gloo", 29521);
  const auto hier = bench_all_reduce(cluster, dir.path(), "hierarchical", 29522);
  ASSERT_EQ(flat.size(), 3u);
  ASSERT_EQ(hier.size(), 3u);
  for (const auto& [size, flat_row] : flat) {
    ASSERT_TRUE(hier.count(size)) << size;
    const double s = static_cast<double>(size);
    const double flat_bytes = flat_row.at("net_tx_bytes").get<double>();
    const double hier_bytes = hier.at(size).at("net_tx_bytes").get<double>();
    EXPECT_GE(flat_bytes, 3 * s) << "flat Gloo, " << size << " bytes";
    EXPECT_LE(flat_bytes, 3 * s * 1.06) << "flat Gloo, " << size << " bytes";
    EXPECT_GE(hier_bytes, 2 * s) << "hierarchical, " << size << " bytes";
    EXPECT_LE(hier_bytes, 2 * s * 1.06) << "hierarchical, " << size << " bytes";
    EXPECT_LE(hier_bytes, flat_bytes * 2 / 3 * 1.06) << size << " bytes";
    EXPECT_EQ(hier.at(size).at("nnodes"), 2);
  }
}

bool listed(const std::string& listing, const std::string& name) {
  std::istringstream lines(listing);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// The fixture the elastic tests use for partitions: up, run, cut (node 0
// cannot reach node 1), heal (it can again), down; afterwards no namespace,
// link, state file or process of the cluster is left.
TEST(FakeCluster, UpRunCutHealDownLeavesNothingBehind) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgfc", "10.88.2", dir.path());
  const Result up = cluster.script({"up", "2", "--rate", "1gbit"});
  ASSERT_EQ(up.status, 0) << up.output;
  EXPECT_NE(up.output.find("node 1  netns brgfc1  10.88.2.11  link up"), std::string::npos)
      << up.output;
  EXPECT_NE(shell("tc qdisc show dev brgfc1-h").find("htb"), std::string::npos);
  EXPECT_NE(shell("ip netns exec brgfc0 tc class show dev eth0").find("rate 1Gbit"),
            std::string::npos);

  const Result again = cluster.script({"up", "2"});
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.output.find("already up"), std::string::npos) << again.output;
  const Result no_node = cluster.script({"run", "2", "true"});
  EXPECT_EQ(no_node.status, 1);
  EXPECT_NE(no_node.output.find("has nodes 0..1, not '2'"), std::string::npos) << no_node.output;

  // `run` is exec: the pid started is the command's, in the node's namespace.
  const fs::path started = dir.path() / "sleeper_started";
  const pid_t sleeper =
      cluster.start_on(1, {"/bin/bash", "-c", "touch " + started.string() + " && exec sleep 300"},
                       dir.path() / "sleep.log");
  const auto deadline = Clock::now() + 30s;
  while (!fs::exists(started) && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(started)) << "the command run on node 1 did not start";
  const Result pids = cluster.script({"status"});
  EXPECT_NE(pids.output.find("link up  processes 1"), std::string::npos) << pids.output;
  EXPECT_NE(shell("ip netns pids " + cluster.netns(1)).find(std::to_string(sleeper)),
            std::string::npos);

  const int listener = listen_in(cluster.netns(1), cluster.address(1), 7000);
  ASSERT_GE(listener, 0) << "cannot listen in " << cluster.netns(1);
  // bash's /dev/tcp: a connect from node 0 to node 1's listener.
  auto connect_from_0 = [&](int timeout_s) {
    return cluster.script({"run", "0", "timeout", std::to_string(timeout_s), "bash", "-c",
                           "exec 3<>/dev/tcp/" + cluster.address(1) + "/7000"});
  };
  const Result before = connect_from_0(60);
  EXPECT_EQ(before.status, 0) << before.output;
  ASSERT_EQ(cluster.script({"cut", "1"}).status, 0);
  EXPECT_NE(cluster.script({"status"}).output.find("10.88.2.11  link cut"), std::string::npos);
  // Cut, the connect can only fail: "no route" once ARP gives up, or killed
  // by timeout.
  const Result cut = connect_from_0(3);
  EXPECT_NE(cut.status, 0) << "node 0 reached node 1 through a cut link: " << cut.output;
  ASSERT_EQ(cluster.script({"heal", "1"}).status, 0);
  const Result healed = connect_from_0(60);
  EXPECT_EQ(healed.status, 0) << healed.output;
  ::close(listener);

  const Result down = cluster.script({"down"});
  EXPECT_EQ(down.status, 0) << down.output;
  // down stopped the process still running on node 1.
  const Result slept = finish(sleeper, dir.path() / "sleep.log", 30s);
  EXPECT_EQ(slept.status, 128 + SIGTERM) << slept.output;
  EXPECT_FALSE(listed(shell("ip netns list"), "brgfc")) << shell("ip netns list");
  EXPECT_FALSE(listed(shell("ip -o link show"), "brgfc")) << shell("ip -o link show");
  EXPECT_FALSE(fs::exists("/run/brigade-fake-cluster/brgfc"));
  EXPECT_EQ(cluster.script({"down"}).status, 0) << "down is idempotent";
  EXPECT_EQ(cluster.script({"status"}).status, 1);
}

// --delay needs netem, which some kernels lack: then up says so and makes
// nothing; where netem exists the node's link gets the delay.
TEST(FakeCluster, DelayWorksOrSaysNetemIsMissing) {
  SKIP_WITHOUT_FAKE_CLUSTER();
  testing::TempDir dir("brigade_cluster");
  Cluster cluster("brgfd", "10.88.3", dir.path());
  const Result up = cluster.script({"up", "1", "--delay", "50us"});
  if (up.status == 0) {
    EXPECT_NE(shell("tc qdisc show dev brgfd0-h").find("netem"), std::string::npos);
  } else {
    EXPECT_NE(up.output.find("--delay needs tc's netem qdisc, which this kernel does not have"),
              std::string::npos)
        << up.output;
    EXPECT_FALSE(listed(shell("ip netns list"), "brgfd")) << shell("ip netns list");
    EXPECT_FALSE(listed(shell("ip -o link show"), "brgfd")) << shell("ip -o link show");
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

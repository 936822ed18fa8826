// The agents' agreement about in-memory snapshots across nodes
// (elastic/snapshot_sync.h): replication peers after a shrink, the
// completion records in a real TcpStore, and malformed values refused
// naming their key.
#include "brigade/elastic/snapshot_sync.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "brigade/ckpt/node_part.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/elastic/coordinator_keys.h"
#include "brigade/parallel/grad_buckets.h"
#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr char kToken[] = "snapshot-sync-test-token";

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class SnapshotSyncTest : public ::testing::Test {
 protected:
  TcpStoreServer server_{"127.0.0.1", 0, kToken};
  TcpStore client_{"127.0.0.1", server_.port(), kToken, 2'000};
  TcpCoordinatorStore store_{client_};

  // The refusal's message, which must name the key; empty when accepted.
  template <typename F>
  std::string refusal(F&& read) {
    try {
      read();
    } catch (const MalformedValue& e) {
      return e.what();
    }
    return "";
  }
};

TEST(ReplicaPeer, IsTheNextMemberNotTheNextNumber) {
  // Three nodes: a ring.
  EXPECT_EQ(replica_peer({0, 1, 2}, 0), 1);
  EXPECT_EQ(replica_peer({0, 1, 2}, 2), 0);
  EXPECT_EQ(replica_source({0, 1, 2}, 0), 2);
  EXPECT_EQ(replica_source({0, 1, 2}, 1), 0);
  // Node 1 left out after a shrink: 0 replicates to 2, and 2 back to 0.
  EXPECT_EQ(replica_peer({0, 2}, 0), 2);
  EXPECT_EQ(replica_peer({0, 2}, 2), 0);
  EXPECT_EQ(replica_source({0, 2}, 2), 0);
  // Four nodes, 2 lost: 1's peer is 3.
  EXPECT_EQ(replica_peer({0, 1, 3}, 1), 3);
  EXPECT_EQ(replica_source({0, 1, 3}, 3), 1);
  // Nobody to replicate to, or not a member (a left-out node, a standby).
  EXPECT_EQ(replica_peer({0}, 0), -1);
  EXPECT_EQ(replica_source({0}, 0), -1);
  EXPECT_EQ(replica_peer({0, 2}, 1), -1);
  EXPECT_EQ(replica_source({0, 2}, 1), -1);
}

TEST_F(SnapshotSyncTest, AStepIsCompleteOnceEveryMemberRecordedIt) {
  const std::vector<int> members = {0, 1, 2};
  EXPECT_FALSE(newest_complete_step(store_, 3, members));
  publish_snapshot_step(store_, 3, 0, 7);
  publish_snapshot_step(store_, 3, 1, 8);
  EXPECT_FALSE(newest_complete_step(store_, 3, members)) << "node 2 has recorded nothing";
  publish_snapshot_step(store_, 3, 2, 6);
  EXPECT_EQ(newest_complete_step(store_, 3, members), 6);
  publish_snapshot_step(store_, 3, 2, 9);
  EXPECT_EQ(newest_complete_step(store_, 3, members), 7);
  // A late, older record never moves a node's back.
  publish_snapshot_step(store_, 3, 0, 5);
  EXPECT_EQ(read_snapshot_step(store_, 3, 0), 7);
  // Per generation: another generation's records do not count.
  EXPECT_FALSE(newest_complete_step(store_, 4, members));
  // Only the members count: node 1 left out.
  publish_snapshot_step(store_, 4, 0, 12);
  publish_snapshot_step(store_, 4, 2, 11);
  EXPECT_EQ(newest_complete_step(store_, 4, {0, 2}), 11);
}

TEST_F(SnapshotSyncTest, ReplicaAddressesRoundTripAndMalformedOnesAreRefused) {
  EXPECT_FALSE(read_replica_address(store_, 1, 1));
  publish_replica_address(store_, 1, 1, {"10.0.0.2", 4567});
  const auto address = read_replica_address(store_, 1, 1);
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "10.0.0.2");
  EXPECT_EQ(address->port, 4567);
  for (const char* bad : {"10.0.0.2", "10.0.0.2:", ":80", "h:0", "h:65536", "h:80x", "h:-1"}) {
    client_.set(replica_address_key(2, 0), bad);
    const std::string why = refusal([&] { read_replica_address(store_, 2, 0); });
    EXPECT_NE(why.find(replica_address_key(2, 0)), std::string::npos) << bad << ": " << why;
  }
}

TEST_F(SnapshotSyncTest, MalformedSnapshotRecordsAreRefusedNamingTheKey) {
  publish_snapshot_step(store_, 5, 0, 3);
  for (const char* bad : {"", "-3", "7 steps", "x"}) {
    client_.set(snapshot_key(5, 1), bad);
    const std::string why = refusal([&] { newest_complete_step(store_, 5, {0, 1}); });
    EXPECT_NE(why.find(snapshot_key(5, 1)), std::string::npos) << bad << ": " << why;
  }
}

// Agents in one process: each a SnapshotSync over its own area and its own
// client of one store; their "workers" are the test writing parts.
class SnapshotRestoreTest : public SnapshotSyncTest {
 protected:
  static constexpr int kRanks = 4;  // 2 nodes x 2
  static GptConfig config() {
    Config c = Config::from_string(
        "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 31\n");
    return GptConfig::from_config(c);
  }
  static std::vector<float> state(int kind, int64_t step) {
    std::vector<float> v(static_cast<size_t>(ParamLayout(config()).size()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(kind * 100000 + i + step);
    return v;
  }
  std::filesystem::path area(int n) const {
    const auto dir = temp_.path() / ("area" + std::to_string(n));
    std::filesystem::create_directories(dir);
    return dir;
  }
  std::unique_ptr<SnapshotSync> agent(int area_number, int64_t agree_timeout_ms = 20'000) {
    SnapshotSync::Options o;
    o.area = area(area_number);
    o.host = "127.0.0.1";
    o.token = kToken;
    o.nnodes = 2;
    o.store = &store_;
    o.max_bytes = 64 << 20;
    o.io_timeout_ms = 5'000;
    o.agree_timeout_ms = agree_timeout_ms;
    o.log = [this](const std::string& line) {
      const std::lock_guard lock(log_mutex_);
      log_ += line + "\n";
    };
    return std::make_unique<SnapshotSync>(std::move(o));
  }
  // Both nodes of the job enter generation `generation`.
  static void enter_both(SnapshotSync& n0, SnapshotSync& n1, int64_t generation) {
    n0.enter_generation(generation, 0, {0, 1});
    n1.enter_generation(generation, 1, {0, 1});
  }
  // Both nodes of the job enter generation `generation` and fail there.
  static void fail_generation(SnapshotSync& n0, SnapshotSync& n1, int64_t generation) {
    enter_both(n0, n1, generation);
    n0.freeze();
    n1.freeze();
  }
  // Both nodes restore generation `generation` at once (node 1 on a thread of
  // its own: each waits for the other's agreement); their steps, node 0's
  // first.
  static std::pair<std::optional<int64_t>, std::optional<int64_t>> restore_both(
      SnapshotSync& n0, SnapshotSync& n1, int64_t generation, int64_t disk_step = -1) {
    auto other = std::async(std::launch::async, [&] {
      return n1.restore(generation, 1, {0, 1}, {}, disk_step);
    });
    const std::optional<int64_t> first = n0.restore(generation, 0, {0, 1}, {}, disk_step);
    return {first, other.get()};
  }
  // Node `node`'s workers commit their part of `step` in `dir`.
  static void write_part(const std::filesystem::path& dir, int node, int64_t step) {
    const int64_t size = ParamLayout(config()).size();
    const BucketPlan plan(size, kRanks, 500);
    const auto p = state(0, step), m = state(1, step), v = state(2, step);
    begin_checkpoint(dir, step);  // the committer's phase 1
    for (int r = node * 2; r < node * 2 + 2; ++r) {
      std::vector<CheckpointPiece> pieces;
      for (const FlatRange& s : plan.owned(r)) {
        const int64_t end = std::min(s.end, size);
        if (s.begin >= end) continue;
        pieces.push_back({StateKind::kParams, s.begin, end, p.data() + s.begin});
        pieces.push_back({StateKind::kExpAvg, s.begin, end, m.data() + s.begin});
        pieces.push_back({StateKind::kExpAvgSq, s.begin, end, v.data() + s.begin});
      }
      write_checkpoint_shard(dir, step, r, ParamLayout(config()), pieces,
                             {.recycle = true, .checksum = false, .read = {}});
    }
    NodePart part;
    part.step = step;
    part.node = node;
    part.first_rank = node * 2;
    part.ranks = 2;
    part.num_shards = kRanks;
    part.config = config();
    if (node == 0) part.header = CheckpointHeader{{{"dp", kRanks}}, {{"step", step}}, "byte"};
    commit_node_part(dir, part, 2, true);
  }
  // Both nodes commit their parts of `step` and replicate them to each other.
  void save_both(SnapshotSync& n0, SnapshotSync& n1, int64_t step) {
    write_part(area(0), 0, step);
    write_part(area(1), 1, step);
    replicate({&n0, &n1}, step);
  }
  // Ticks the agents until each recorded `step` (its peer keeps it).
  static void replicate(const std::vector<SnapshotSync*>& agents, int64_t step) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      bool all = true;
      for (SnapshotSync* a : agents) {
        a->tick();
        all = all && a->recorded_step() >= step;
      }
      if (all) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "not replicated";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // The assembled snapshot in `dir` holds exactly step's state.
  static void expect_state(const std::filesystem::path& dir, int64_t step) {
    const Manifest manifest = verify_checkpoint(step_directory(dir, step), true);
    std::vector<float> loaded(state(0, step).size());
    load_checkpoint_state(step_directory(dir, step), manifest, config(), StateKind::kExpAvgSq,
                          loaded.data());
    const std::vector<float> expected = state(2, step);
    const ParamLayout layout(config());
    for (const ParamInfo& info : layout.params()) {
      for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
        ASSERT_EQ(loaded[i], expected[i]) << i;
      }
    }
  }
  testing::TempDir temp_{"snapshot_sync"};
  std::mutex log_mutex_;
  std::string log_;
};

TEST_F(SnapshotRestoreTest, EveryNodeRestartsInPlaceFromTheNewestStepCompleteEverywhere) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 3);
  write_part(area(0), 0, 4);
  replicate({a0.get()}, 4);
  // Node 1's part of 4 is written but not replicated when the job fails.
  write_part(area(1), 1, 4);
  a0->freeze();
  a1->freeze();
  EXPECT_EQ(newest_complete_step(store_, 0, {0, 1}), 3);
  const auto [first, second] = restore_both(*a0, *a1, 1);
  EXPECT_EQ(first, 4) << log_;
  EXPECT_EQ(second, 4) << log_;
  expect_state(area(0), 4);
  expect_state(area(1), 4);
  // The parts are the old branch's (node 1's of step 4 was never
  // replicated, its step 5 would be another history): none is left to be
  // offered or assembled in generation 1.
  EXPECT_TRUE(node_part_steps(area(0)).empty());
  EXPECT_TRUE(node_part_steps(area(1)).empty());
}

// A fault during a recovery, before the new generation's first snapshot:
// the next restart resumes from the step that generation resumed from, not
// from the (older) disk checkpoint; not when the disk checkpoint is as new.
TEST_F(SnapshotRestoreTest, AGenerationThatFailedBeforeItsFirstSnapshotResumesFromItsOwnStart) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 7);
  a0->freeze();
  a1->freeze();
  const auto [first0, first1] = restore_both(*a0, *a1, 1);
  ASSERT_EQ(first0, 7) << log_;
  ASSERT_EQ(first1, 7) << log_;
  // Generation 1 fails before any part is written.
  enter_both(*a0, *a1, 1);
  a0->tick();
  a1->tick();
  a0->freeze();
  a1->freeze();
  const auto [second0, second1] = restore_both(*a0, *a1, 2, 2);
  EXPECT_EQ(second0, 7) << log_;
  EXPECT_EQ(second1, 7) << log_;
  expect_state(area(0), 7);
  expect_state(area(1), 7);
  EXPECT_NE(log_.find("node 0: generation 1 left no snapshot to resume from (node 0 recorded no "
                      "snapshot part in generation 1); the copy of step 7 it resumed from instead"),
            std::string::npos)
      << log_;
  // Generation 2 fails before its first snapshot too: step 7 again.
  fail_generation(*a0, *a1, 2);
  const auto [third0, third1] = restore_both(*a0, *a1, 3, 2);
  EXPECT_EQ(third0, 7) << log_;
  EXPECT_EQ(third1, 7) << log_;
  // And generation 3, with a checkpoint of step 7 on disk by then: nothing
  // newer in memory, so disk.
  fail_generation(*a0, *a1, 3);
  const auto [fourth0, fourth1] = restore_both(*a0, *a1, 4, 7);
  EXPECT_FALSE(fourth0) << log_;
  EXPECT_FALSE(fourth1) << log_;
  EXPECT_FALSE(latest_checkpoint(area(0)));
}

// A node that holds no copy of that step (a standby new to the generation)
// keeps every node off it.
TEST_F(SnapshotRestoreTest, WithoutEveryNodesCopyOfTheResumedStepEveryNodeGoesToDisk) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 4);
  a0->freeze();
  a1->freeze();
  const auto [first0, first1] = restore_both(*a0, *a1, 1);
  ASSERT_EQ(first0, 4) << log_;
  ASSERT_EQ(first1, 4) << log_;
  a0->enter_generation(1, 0, {0, 1});
  a0->freeze();
  a1.reset();  // node 1 is lost with its copy; a standby takes its place
  std::filesystem::remove_all(area(1));
  auto standby = agent(2);
  const auto [second0, second1] = restore_both(*a0, *standby, 2);
  EXPECT_FALSE(second0) << log_;
  EXPECT_FALSE(second1) << log_;
  EXPECT_NE(log_.find("node 1 holds no copy of step 4, which generation 1 resumed from"),
            std::string::npos)
      << log_;
}

TEST_F(SnapshotRestoreTest, AStandbyGetsTheLostNodesPartFromItsPeersReplica) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 5);
  a0->freeze();
  a1.reset();  // node 1 is lost, its area with it
  std::filesystem::remove_all(area(1));
  auto standby = agent(2);
  auto other = std::async(std::launch::async, [&] { return standby->restore(1, 1, {0, 1}); });
  EXPECT_EQ(a0->restore(1, 0, {0, 1}), 5) << log_;
  EXPECT_EQ(other.get(), 5) << log_;
  expect_state(area(2), 5);
  expect_state(area(0), 5);
}

// Node 1 cut off the network: its address is still published, but nothing
// there ever answers. The coordinator declared it lost before the restart,
// so neither node asks it (each would wait out a timeout: here the 5 s
// reply timeout, across nodes the 2 s connect timeout that was a
// partition's whole rendezvous, issue 14): its part comes from node 0's
// replica at once.
TEST_F(SnapshotRestoreTest, ANodeDeclaredLostIsNotWaitedForItsPart) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 5);
  a0->freeze();
  a1.reset();
  std::filesystem::remove_all(area(1));
  // Listens and never accepts: a connection gets no further than the
  // kernel's handshake, as with a node whose link went down.
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof at;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(::listen(silent, 16), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&at), &length), 0);
  publish_replica_address(store_, 0, 1, {"127.0.0.1", ntohs(at.sin_port)});
  store_.set(coordinator_key("node/1/lost"), "0");  // the leader's verdict in generation 0
  auto standby = agent(2);
  const auto start = std::chrono::steady_clock::now();
  auto other = std::async(std::launch::async, [&] { return standby->restore(1, 1, {0, 1}); });
  EXPECT_EQ(a0->restore(1, 0, {0, 1}), 5) << log_;
  EXPECT_EQ(other.get(), 5) << log_;
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(silent);
  expect_state(area(2), 5);
  // A tiny model's parts, two agents in one process: tens of ms; the bound
  // leaves a loaded machine's margin under the connect timeout.
  EXPECT_LT(took, std::chrono::milliseconds(1'500))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n"
      << log_;
}

// A verdict of an older generation does not make a node lost now: node 1
// was declared lost in generation 0 and is a member of generation 1 again
// (a standby in its place, or rejoined). When generation 1 fails, it is
// asked for its own part, the only copy of step 5 here (its replica on
// node 0 is gone): skipping it would leave the nodes without step 5.
TEST_F(SnapshotRestoreTest, ALossDeclaredInAnEarlierGenerationDoesNotSkipTheNode) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 1);
  save_both(*a0, *a1, 5);
  a0->freeze();
  a1->freeze();
  std::filesystem::remove_all(area(0) / "replicas");
  store_.set(coordinator_key("node/1/lost"), "0");
  const auto [first, second] = restore_both(*a0, *a1, 2);
  EXPECT_EQ(first, 5) << log_;
  EXPECT_EQ(second, 5) << log_;
  expect_state(area(0), 5);
}

TEST_F(SnapshotRestoreTest, AfterAShrinkTheSurvivorAssemblesTheLostNodesReplica) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 2);
  a0->freeze();
  a1.reset();
  // Generation 1 runs node 0 alone: it needs node 1's part for every bucket.
  store_.set(elastic::detail::members_key(1), "0");
  EXPECT_EQ(a0->restore(1, 0, {0}), 2) << log_;
  expect_state(area(0), 2);
  // Alone, the next generation replicates to nobody and records what it wrote.
  a0->enter_generation(1, 0, {0});
  write_part(area(0), 0, 3);
  a0->tick();
  EXPECT_EQ(read_snapshot_step(store_, 1, 0), 3);
  // Generation 1 failed too: its members are {0}, from gen/1/members.
  EXPECT_EQ(members_of(store_, 1, 2), std::vector<int>{0});
  EXPECT_EQ(members_of(store_, 0, 2), (std::vector<int>{0, 1}));
}

TEST_F(SnapshotRestoreTest, WithoutEveryNodesPartNobodyResumesFromASnapshot) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 6);
  // A restart assembled step 6 here before; this one must not leave it.
  assemble_checkpoint({node_part_directory(area(0), 6), node_part_directory(area(1), 6)}, area(0));
  a0->freeze();
  a1->freeze();
  // Node 1's part is gone from its area and from its peer's replica.
  std::filesystem::remove_all(node_part_directory(area(1), 6));
  std::filesystem::remove_all(area(0) / "replicas");
  auto other = std::async(std::launch::async, [&] { return a1->restore(1, 1, {0, 1}); });
  EXPECT_FALSE(a0->restore(1, 0, {0, 1})) << log_;
  EXPECT_FALSE(other.get()) << log_;
  EXPECT_FALSE(latest_checkpoint(area(0))) << "an assembled snapshot was left to resume from";
  EXPECT_NE(log_.find("node 0: no in-memory snapshot to resume from (node 1's part of step 6 "
                      "could not be fetched"),
            std::string::npos)
      << log_;
}

TEST_F(SnapshotRestoreTest, ANodeThatCouldNotAssembleKeepsEveryNodeOffTheSnapshot) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 7);
  a0->freeze();
  a1->freeze();
  // Node 1 (its own restore, say, cut short) could not: node 0 assembles
  // step 7 all the same, and still does not resume from it.
  store_.set(restore_key(1, 1), "none");
  EXPECT_FALSE(a0->restore(1, 0, {0, 1})) << log_;
  EXPECT_FALSE(latest_checkpoint(area(0)));
  EXPECT_NE(
      log_.find("node 0: no in-memory snapshot to resume from (node 1 could not assemble it)"),
      std::string::npos)
      << log_;
}

TEST_F(SnapshotRestoreTest, TheRestoreKeepsTheAgentBeatingWhileItWaits) {
  // Node 1 never says what it assembled: node 0 waits out the agreement,
  // longer than the coordinator waits for a beat (2 s).
  auto a0 = agent(0, 3'000);
  std::vector<std::chrono::steady_clock::time_point> calls;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(a0->restore(1, 0, {0, 1}, [&] {
    calls.push_back(std::chrono::steady_clock::now());
    return true;
  })) << log_;
  const auto end = std::chrono::steady_clock::now();
  ASSERT_GE(end - start, std::chrono::milliseconds(3'000)) << log_;
  ASSERT_FALSE(calls.empty()) << "the restore never let the agent beat";
  // Every 100 ms; 1.5 s leaves a loaded machine's margin, still under the
  // coordinator's 2 s (a restore that never beats fails at once).
  auto longest = calls.front() - start;
  for (size_t i = 1; i < calls.size(); ++i) longest = std::max(longest, calls[i] - calls[i - 1]);
  longest = std::max(longest, end - calls.back());
  EXPECT_LT(longest, std::chrono::milliseconds(1'500))
      << calls.size() << " calls, the longest gap "
      << std::chrono::duration_cast<std::chrono::milliseconds>(longest).count() << " ms";
}

TEST_F(SnapshotRestoreTest, AJobThatEndsCutsTheRestoreShort) {
  auto a0 = agent(0, 60'000);
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(a0->restore(1, 0, {0, 1}, [&] { return ++calls < 3; })) << log_;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "the restore waited out the agreement after the job ended";
  EXPECT_NE(log_.find("the job ended during the restore"), std::string::npos) << log_;
}

TEST_F(SnapshotRestoreTest, APartItsOwnerDiscardedIsNotTakenFromThePeersReplica) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 3);
  save_both(*a0, *a1, 4);
  // Node 1's workers found a silent corruption in step 4 after its part
  // was replicated, and discarded it (Trainer::discard_saves).
  std::filesystem::remove_all(node_part_directory(area(1), 4));
  a0->freeze();
  a1->freeze();
  const auto [first, second] = restore_both(*a0, *a1, 1);
  EXPECT_EQ(first, 3) << log_;
  EXPECT_EQ(second, 3) << log_;
  expect_state(area(0), 3);
  expect_state(area(1), 3);
}

TEST_F(SnapshotRestoreTest, NodesThatAssembledDifferentStepsResumeFromNoSnapshot) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 4);
  a0->freeze();
  a1->freeze();
  // Node 1 assembled step 3 (another view of the records): node 0 has 4.
  store_.set(restore_key(1, 1), "3");
  EXPECT_FALSE(a0->restore(1, 0, {0, 1})) << log_;
  EXPECT_FALSE(latest_checkpoint(area(0)));
  EXPECT_NE(log_.find("node 1 assembled step 3, this node 4"), std::string::npos) << log_;
}

TEST_F(SnapshotRestoreTest, ANodeThatTimedOutDecidesForEveryNode) {
  auto a0 = agent(0, 1'000);
  // Alone, node 0 waits 1 s for node 1, gives up and decides: no snapshot.
  EXPECT_FALSE(a0->restore(1, 0, {0, 1})) << log_;
  EXPECT_EQ(store_.try_get(restore_decision_key(1)), "none");
  // In generation 2, node 0 (which timed out) said step 5 before it
  // decided "none" and resumed from disk; node 1 comes later, assembles
  // step 5 too and hears the same from every node: it must still follow
  // the decision.
  a0 = agent(0);
  auto a1 = agent(1);
  enter_both(*a0, *a1, 1);
  save_both(*a0, *a1, 5);
  a0->freeze();
  a1->freeze();
  store_.set(restore_key(2, 0), "5");
  ASSERT_EQ(store_.add(restore_deciding_key(2), 1), 1);
  store_.set(restore_decision_key(2), "none");
  EXPECT_FALSE(a1->restore(2, 1, {0, 1})) << log_;
  EXPECT_FALSE(latest_checkpoint(area(1))) << "an assembled snapshot was left to resume from";
  EXPECT_NE(log_.find("another node decided on no snapshot"), std::string::npos) << log_;
}

TEST_F(SnapshotRestoreTest, APartOnItsWayToASlowPeerIsNotPrunedMeanwhile) {
  // A peer that takes the connection and never answers: the send of step 3
  // stays in flight while the workers commit three more parts (keep 2).
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(at);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &length), 0);
  {
    ReplicaSender sender({"127.0.0.1", ntohs(at.sin_port), kToken, 60'000}, 0, 0,
                         [](const std::string&) {});
    write_part(area(0), 0, 3);
    sender.offer(3, node_part_directory(area(0), 3));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pinned_node_part(area(0)) != 3) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the send never pinned its part";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    write_part(area(0), 0, 4);
    write_part(area(0), 0, 5);
    write_part(area(0), 0, 6);
    EXPECT_EQ(node_part_steps(area(0)), (std::vector<int64_t>{3, 5, 6}));
    EXPECT_NO_THROW(read_node_part(node_part_directory(area(0), 3)));
  }
  ::close(listener);
  // The send is over (the sender stopped): the next commit prunes it.
  EXPECT_FALSE(pinned_node_part(area(0)));
  write_part(area(0), 0, 7);
  EXPECT_EQ(node_part_steps(area(0)), (std::vector<int64_t>{6, 7}));
}

TEST_F(SnapshotRestoreTest, NoRestoreWhenTheDiskCheckpointIsAsNew) {
  auto a0 = agent(0), a1 = agent(1);
  enter_both(*a0, *a1, 0);
  save_both(*a0, *a1, 4);
  a0->freeze();
  a1->freeze();
  // A checkpoint of step 4 is on disk (a rejoin's interrupt checkpoint):
  // nothing to gain from fetching.
  auto other = std::async(std::launch::async, [&] { return a1->restore(1, 1, {0, 1}, {}, 4); });
  EXPECT_FALSE(a0->restore(1, 0, {0, 1}, {}, 4)) << log_;
  EXPECT_FALSE(other.get()) << log_;
  EXPECT_FALSE(latest_checkpoint(area(0)));
  EXPECT_NE(log_.find("the newest disk checkpoint is at least as new as any part (step 4)"),
            std::string::npos)
      << log_;
}

TEST_F(SnapshotRestoreTest, AMalformedPeerAddressIsLoggedOnceAndReplicationStops) {
  auto a0 = agent(0);
  a0->enter_generation(0, 0, {0, 1});
  store_.set(replica_address_key(0, 1), "no-port-here");
  write_part(area(0), 0, 3);
  for (int i = 0; i < 20; ++i) a0->tick();
  EXPECT_EQ(count_of(log_, replica_address_key(0, 1)), 1u) << log_;
  EXPECT_NE(log_.find("snapshot replication of node 0 is off for generation 0"), std::string::npos)
      << log_;
  EXPECT_EQ(a0->recorded_step(), -1);
  // The next generation tries again.
  a0->enter_generation(1, 0, {0, 1});
  a0->tick();
  EXPECT_EQ(count_of(log_, "is off for generation"), 1u) << log_;
}

TEST_F(SnapshotRestoreTest, AMalformedRestoreAgreementIsRefusedNamingTheKey) {
  auto a0 = agent(0);
  store_.set(restore_key(1, 1), "seven");
  EXPECT_FALSE(a0->restore(1, 0, {0, 1}));
  EXPECT_NE(log_.find(restore_key(1, 1)), std::string::npos) << log_;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

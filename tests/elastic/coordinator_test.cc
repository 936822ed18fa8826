// The coordinator's decisions (elastic/coordinator.h), with every node's
// agent a Coordinator over its own client of one real TcpStore, and time
// passed in by the test: no sleep decides anything. The agents end to end,
// on network-namespace nodes, run in tests/cli/elastic_nodes_cluster_test.cc.
#include "brigade/elastic/coordinator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/tcp_store.h"
#include "brigade/core/error.h"
#include "brigade/elastic/coordinator_keys.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kMs = 1'000'000;
constexpr char kToken[] = "coordinator-test-token";
using State = JobView::State;

// One node's agent: its own store connection, as in `brigade launch`.
struct Node {
  Node(uint16_t port, int nnodes, int rank, int max_restarts, int64_t now,
       int64_t call_timeout_ms = 1'000)
      : client("127.0.0.1", port, kToken, call_timeout_ms), store(client) {
    CoordinatorOptions o;
    o.nnodes = nnodes;
    o.node_rank = rank;
    o.max_restarts = max_restarts;
    coordinator = std::make_unique<Coordinator>(store, o, now);
  }
  TcpStore client;
  TcpCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

Incident crash(int rank, bool injected, bool signalled) {
  Incident i;
  i.kind = "crash";
  i.rank = rank;
  i.pid = 1000 + rank;
  i.injected = injected;
  if (signalled) {
    i.signal = 9;
  } else {
    i.exit_code = 1;
  }
  i.what = "worker rank " + std::to_string(rank) + (signalled ? " was killed" : " exited 1");
  i.fault_ns = 100 * kMs;
  i.detected_ns = 130 * kMs;  // detected after 30 ms
  i.last_step = 4;
  return i;
}

// The real store, whose next calls fail as a call that timed out does.
class FlakyStore : public CoordinatorStore {
 public:
  explicit FlakyStore(CoordinatorStore& store) : store_(store) {}
  void set(const std::string& key, const std::string& value) override {
    fail();
    store_.set(key, value);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    fail();
    return store_.try_get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    fail();
    return store_.add(key, delta);
  }
  std::string address() const override { return store_.address(); }
  int64_t call_timeout_ms() const override { return store_.call_timeout_ms(); }
  int failing = 0;  // how many of the next calls fail

 private:
  void fail() {
    if (failing == 0) return;
    --failing;
    throw_error("the store call timed out");
  }
  CoordinatorStore& store_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Node> node(int rank, int nnodes = 2, int max_restarts = 3, int64_t now = 0) {
    return std::make_unique<Node>(server_.port(), nnodes, rank, max_restarts, now);
  }
  TcpStoreServer server_{"127.0.0.1", 0, kToken};
};

// Node 1 of 2 (3 restarts) over a FlakyStore, and node 0, both polled
// from 0 to 1 s: their beats seen, nothing failed.
class FlakyNodeTest : public CoordinatorTest {
 protected:
  FlakyNodeTest() {
    CoordinatorOptions o;
    o.nnodes = 2;
    o.node_rank = 1;
    o.max_restarts = 3;
    n1 = std::make_unique<Coordinator>(flaky, o, 0);
    for (; t <= 1'000 * kMs; t += 100 * kMs) {
      EXPECT_EQ(n1->poll(t).state, State::kRunning) << t / kMs;
      EXPECT_EQ(n0->poll(t).state, State::kRunning) << t / kMs;
    }
  }
  std::unique_ptr<Node> node0 = node(0);
  Coordinator* n0 = node0->coordinator.get();
  TcpStore client{"127.0.0.1", server_.port(), kToken, 1'000};
  TcpCoordinatorStore real{client};
  FlakyStore flaky{real};
  std::unique_ptr<Coordinator> n1;
  int64_t t = 0;
};

TEST_F(CoordinatorTest, AFailureAnywhereStopsEveryNodeAndAllRestartTogether) {
  auto n0 = node(0), n1 = node(1);
  int64_t t = 50 * kMs;
  EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning);
  EXPECT_EQ(n1->coordinator->poll(t).state, State::kRunning);

  n1->coordinator->report_failure(crash(3, /*injected=*/true, /*signalled=*/true));
  for (auto* n : {n0.get(), n1.get()}) {
    const JobView v = n->coordinator->poll(t += 100 * kMs);
    EXPECT_EQ(v.state, State::kFailing);
    EXPECT_TRUE(v.will_restart);
  }
  // Node 1's workers are gone, node 0's still run: nothing opens yet, so no
  // worker of generation 0 can meet one of generation 1.
  n1->coordinator->report_stopped(false);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(n0->coordinator->poll(t += 100 * kMs).state, State::kFailing);
    EXPECT_EQ(n1->coordinator->poll(t).state, State::kFailing);
  }
  EXPECT_THROW(n1->coordinator->enter_next_generation(), Error);
  n0->coordinator->report_stopped(false);
  n0->coordinator->poll(t += 100 * kMs);  // the leader decides
  for (auto* n : {n0.get(), n1.get()}) {
    const JobView v = n->coordinator->poll(t += 100 * kMs);
    ASSERT_EQ(v.state, State::kRestart);
    ASSERT_TRUE(v.cause);
    EXPECT_EQ(v.cause->node, 1);
    EXPECT_EQ(v.cause->rank, 3);
    EXPECT_EQ(v.cause->signal, 9);
    EXPECT_EQ(v.cause->last_step, 4);
    EXPECT_NEAR((v.cause->detected_ns - v.cause->fault_ns) * 1e-6, 30.0, 0.01);
    n->coordinator->enter_next_generation();
    EXPECT_EQ(n->coordinator->generation(), 1);
  }
  // Generation 1 starts clean: generation 0's failure is behind it.
  EXPECT_EQ(n0->coordinator->poll(t += 100 * kMs).state, State::kRunning);
  EXPECT_EQ(n1->coordinator->poll(t).state, State::kRunning);
}

TEST_F(CoordinatorTest, TheLikeliestCauseAmongTheNodesReportsIsTheIncident) {
  auto n0 = node(0), n1 = node(1);
  // Node 0's worker saw its peer die through a collective and exited 1,
  // and said so first; node 1's worker was killed by a signal.
  n0->coordinator->report_failure(crash(0, false, false));
  n1->coordinator->report_failure(crash(2, false, true));
  n0->coordinator->report_stopped(false);
  n1->coordinator->report_stopped(false);
  n0->coordinator->poll(kMs);
  const JobView v = n1->coordinator->poll(2 * kMs);
  ASSERT_EQ(v.state, State::kRestart);
  EXPECT_EQ(v.cause->node, 1);
  EXPECT_EQ(v.cause->rank, 2);
}

TEST_F(CoordinatorTest, RestartsAreCountedForTheWholeJobAndBounded) {
  auto n0 = node(0, 2, /*max_restarts=*/1), n1 = node(1, 2, 1);
  int64_t t = 0;
  auto fail_generation = [&](Node& failing) {
    failing.coordinator->report_failure(crash(1, true, true));
    n0->coordinator->report_stopped(false);
    n1->coordinator->report_stopped(false);
    n0->coordinator->poll(t += 100 * kMs);
    n1->coordinator->poll(t);
    t += 100 * kMs;
    const JobView v0 = n0->coordinator->poll(t);
    return std::make_pair(v0, n1->coordinator->poll(t));
  };
  auto [first0, first1] = fail_generation(*n0);
  ASSERT_EQ(first0.state, State::kRestart);
  ASSERT_EQ(first1.state, State::kRestart);
  n0->coordinator->enter_next_generation();
  n1->coordinator->enter_next_generation();
  EXPECT_FALSE(n1->coordinator->poll(t += 100 * kMs).will_restart);
  // The second failure is on the other node: the restart it would need is
  // the job's second.
  auto [second0, second1] = fail_generation(*n1);
  for (const JobView& v : {second0, second1}) {
    ASSERT_EQ(v.state, State::kEnded);
    EXPECT_NE(v.why.find("no restart left: 1 used"), std::string::npos) << v.why;
    ASSERT_TRUE(v.cause);
    EXPECT_EQ(v.cause->node, 1);
    EXPECT_EQ(v.lost_node, -1);
  }
}

TEST_F(CoordinatorTest, SuccessNeedsEveryNodesWorkersDone) {
  auto n0 = node(0), n1 = node(1);
  n0->coordinator->report_stopped(true);
  EXPECT_EQ(n0->coordinator->poll(kMs).state, State::kRunning);
  n1->coordinator->report_stopped(true);
  EXPECT_EQ(n1->coordinator->poll(2 * kMs).state, State::kSucceeded);
  EXPECT_EQ(n0->coordinator->poll(3 * kMs).state, State::kSucceeded);
}

// Node 1's agent beats every poll until t = 1 s, then falls silent (dead,
// or cut off): node 0 names it after 2 s, not before, and the node that is
// still there hears of the end.
TEST_F(CoordinatorTest, ASilentAgentEndsTheJobNamingItsNodeAfterTwoSeconds) {
  auto n0 = node(0, 3), n1 = node(1, 3), n2 = node(2, 3);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    n1->coordinator->poll(t);
    n2->coordinator->poll(t);
    EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  // The last beat node 0 saw was at 1000 ms.
  for (; t <= 3'000 * kMs; t += 100 * kMs) {
    n2->coordinator->poll(t);
    EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  n2->coordinator->poll(t);
  const JobView v = n0->coordinator->poll(t);  // 3100 ms: silent for 2.1 s
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_FALSE(v.lost_coordinator);
  EXPECT_NE(v.why.find("node 1 is lost: its agent sent no heartbeat for 2.1 s"), std::string::npos)
      << v.why;
  EXPECT_FALSE(v.signal);
  ASSERT_TRUE(v.cause);
  EXPECT_EQ(v.cause->kind, "node_lost");
  EXPECT_EQ(v.cause->node, 1);
  EXPECT_NEAR((v.cause->detected_ns - v.cause->fault_ns) * 1e-6, 2'100.0, 0.01);
  const JobView other = n2->coordinator->poll(t + 100 * kMs);
  EXPECT_EQ(other.state, State::kEnded);
  EXPECT_EQ(other.lost_node, 1);
}

// An agent busy between generations (a snapshot restore) beats through
// keep_alive: the leader does not take it for lost, and it hears when the
// job ends meanwhile.
TEST_F(CoordinatorTest, AnAgentThatOnlyKeepsAliveIsNotLostAndHearsTheEnd) {
  auto n0 = node(0, 3), n1 = node(1, 3), n2 = node(2, 3);
  int64_t t = 0;
  for (; t <= 4'000 * kMs; t += 100 * kMs) {
    EXPECT_TRUE(n1->coordinator->keep_alive(t)) << t / kMs;
    n2->coordinator->poll(t);
    EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  // Node 2 goes silent: the leader ends the job, and node 1's keep_alive
  // says there is no point going on.
  for (; t <= 7'000 * kMs && n0->coordinator->poll(t).state == State::kRunning; t += 100 * kMs) {
    EXPECT_TRUE(n1->coordinator->keep_alive(t)) << t / kMs;
  }
  ASSERT_LE(t, 7'000 * kMs) << "node 2's silence was never noticed";
  EXPECT_FALSE(n1->coordinator->keep_alive(t));
}

// Node 0's agent silent for node 1 (stalled, or cut off from node 1 only):
// node 1 ends, and ends the job, so that node 0's workers, should they
// live, do not wait for node 1's in a collective.
TEST_F(CoordinatorTest, TheOtherNodesNoticeASilentLeaderAndEndTheJob) {
  auto n0 = node(0), n1 = node(1);
  n0->coordinator->poll(0);
  int64_t t = 0;
  for (; t <= 2'000 * kMs; t += 100 * kMs) {
    EXPECT_EQ(n1->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  const JobView v = n1->coordinator->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_TRUE(v.lost_coordinator);
  EXPECT_NE(v.why.find("lost the coordinator: node 0's agent sent no heartbeat"), std::string::npos)
      << v.why;
  const JobView leader = n0->coordinator->poll(t);
  ASSERT_EQ(leader.state, State::kEnded);
  EXPECT_FALSE(leader.lost_coordinator);
  EXPECT_FALSE(leader.signal);
  EXPECT_NE(leader.why.find("node 1 lost the coordinator: node 0's agent sent no heartbeat"),
            std::string::npos)
      << leader.why;
}

// One store call of node 1 times out (a slow store, or one gone for this
// node): node 1 leaves (lost_coordinator) and writes no end, so a store
// that was only slow ends no healthy job; the leader finds node 1 silent
// after the allowed 2 s and names it lost, not the store.
TEST_F(FlakyNodeTest, AStoreCallThatTimedOutEndsOnlyItsNode) {
  flaky.failing = 1;
  const JobView v = n1->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_TRUE(v.lost_coordinator);
  EXPECT_NE(v.why.find("lost contact with the coordinator's store at 127.0.0.1:"),
            std::string::npos)
      << v.why;
  // The store answers again (it was slow): nobody wrote an end.
  EXPECT_FALSE(real.try_get(detail::end_key()));
  // The last beat node 0 saw was at 1000 ms.
  for (; t <= 3'000 * kMs; t += 100 * kMs) {
    EXPECT_EQ(n0->poll(t).state, State::kRunning) << t / kMs;
  }
  const JobView leader = n0->poll(t);
  ASSERT_EQ(leader.state, State::kEnded);
  EXPECT_EQ(leader.lost_node, 1);
  EXPECT_FALSE(leader.lost_coordinator);
  EXPECT_NE(leader.why.find("node 1 is lost: its agent sent no heartbeat"), std::string::npos)
      << leader.why;
}

// Node 1 loses the store for a call but reaches it again before the
// leader's 2 s: its loss becomes its failure report, which outranks node
// 0's workers' error exits (their peers were killed by node 1's agent),
// and both nodes restart in place. Later, found silent first, the same
// node is told the job ended without it.
TEST_F(FlakyNodeTest, ANodeThatReachesTheStoreAgainInTimeRestartsInPlace) {
  flaky.failing = 2;
  const JobView v = n1->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_TRUE(v.lost_coordinator);
  EXPECT_TRUE(v.store_unreachable);
  Incident lost;
  lost.kind = "store_lost";
  lost.rank = -1;
  lost.what = "node 1 lost the coordinator's store";
  EXPECT_THROW(n1->regain_store(lost, t += 100 * kMs), Error);  // not yet
  EXPECT_FALSE(n1->regain_store(lost, t += 100 * kMs).has_value());
  n0->report_failure(crash(0, false, false));
  n1->report_stopped(false);
  n0->report_stopped(false);
  n0->poll(t += 100 * kMs);  // the leader decides (node 1 beat again)
  for (Coordinator* c : {n0, n1.get()}) {
    const JobView next = c->poll(t += 100 * kMs);
    ASSERT_EQ(next.state, State::kRestart) << next.why;
    EXPECT_EQ(next.cause->kind, "store_lost");
    EXPECT_EQ(next.cause->node, 1);
    c->enter_next_generation();
    EXPECT_EQ(c->members(), (std::vector<int>{0, 1}));
  }
  // Generation 1: node 1 loses the store for longer than node 0 waits.
  ASSERT_EQ(n1->poll(t += 100 * kMs).state, State::kRunning);
  flaky.failing = 1'000;
  ASSERT_TRUE(n1->poll(t).store_unreachable);
  for (int i = 0; i < 25; ++i) n0->poll(t += 100 * kMs);
  flaky.failing = 0;
  const auto out = n1->regain_store(lost, t += 100 * kMs);
  ASSERT_TRUE(out.has_value());
  // The job ended without it (no standby, no fewer nodes allowed): node 1
  // leaves with the leader's reason, and reports nothing.
  EXPECT_EQ(out->state, State::kEnded);
  EXPECT_NE(out->why.find("node 1 is lost: its agent sent no heartbeat"), std::string::npos)
      << out->why;
  EXPECT_FALSE(real.try_get(coordinator_key("gen/1/failure/1")));
}

// Node 1 loses the store while the generation's decision is awaited (its
// workers stopped for node 0's failure): back in time it only beats again,
// reporting nothing, and the cause stays node 0's.
TEST_F(FlakyNodeTest, ALossWhileTheDecisionIsAwaitedIsRegainedWithoutAReport) {
  n0->report_failure(crash(0, false, true));
  ASSERT_EQ(n1->poll(t += 100 * kMs).state, State::kFailing);
  n1->report_stopped(false);
  flaky.failing = 1;
  ASSERT_TRUE(n1->poll(t += 100 * kMs).store_unreachable);
  EXPECT_FALSE(n1->regain_store(std::nullopt, t += 100 * kMs).has_value());
  EXPECT_FALSE(real.try_get(coordinator_key("gen/0/failure/1")));
  n0->report_stopped(false);
  n0->poll(t += 100 * kMs);  // the leader decides
  for (Coordinator* c : {n0, n1.get()}) {
    const JobView next = c->poll(t += 100 * kMs);
    ASSERT_EQ(next.state, State::kRestart) << next.why;
    EXPECT_EQ(next.cause->node, 0);
    EXPECT_EQ(next.cause->kind, "crash");
  }
}

// A report the store did not take (its call timed out) is sent again: the
// failure is not lost with it.
TEST_F(CoordinatorTest, AFailureReportTheStoreDidNotTakeIsSentAgain) {
  auto n0 = node(0);
  TcpStore client("127.0.0.1", server_.port(), kToken, 1'000);
  TcpCoordinatorStore real(client);
  FlakyStore flaky(real);
  CoordinatorOptions o;
  o.nnodes = 2;
  o.node_rank = 1;
  Coordinator n1(flaky, o, 0);
  flaky.failing = 1;
  EXPECT_THROW(n1.report_failure(crash(3, true, true)), Error);
  EXPECT_EQ(n0->coordinator->poll(kMs).state, State::kRunning);
  EXPECT_EQ(n1.poll(2 * kMs).state, State::kFailing);
  EXPECT_EQ(n0->coordinator->poll(3 * kMs).state, State::kFailing);
  // The failure is the job's incident, as if sent at once.
  n1.report_stopped(false);
  n0->coordinator->report_stopped(false);
  n0->coordinator->poll(4 * kMs);
  const JobView v = n1.poll(5 * kMs);
  ASSERT_EQ(v.state, State::kRestart);
  EXPECT_EQ(v.cause->rank, 3);
}

// The same, when the next the agent says is that its workers stopped: the
// report goes first, so the leader never sees a node stopped for a failure
// nobody reported.
TEST_F(CoordinatorTest, AFailureReportTheStoreDidNotTakeGoesBeforeTheStop) {
  auto n0 = node(0);
  TcpStore client("127.0.0.1", server_.port(), kToken, 1'000);
  TcpCoordinatorStore real(client);
  FlakyStore flaky(real);
  CoordinatorOptions o;
  o.nnodes = 2;
  o.node_rank = 1;
  Coordinator n1(flaky, o, 0);
  flaky.failing = 1;
  EXPECT_THROW(n1.report_failure(crash(3, true, true)), Error);
  n1.report_stopped(false);
  EXPECT_EQ(n0->coordinator->poll(kMs).state, State::kFailing);
}

// Node 0's store client would let a call last as long as the silence that
// makes a node lost: refused before anything starts.
TEST_F(CoordinatorTest, AStoreCallTimeoutAboveHalfTheAllowedSilenceIsRefused) {
  TcpStore client("127.0.0.1", server_.port(), kToken, 1'001);
  TcpCoordinatorStore store(client);
  CoordinatorOptions o;
  o.nnodes = 2;
  try {
    Coordinator c(store, o, 0);
    ADD_FAILURE() << "a 1001 ms call timeout was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("allows 1001 ms per call, more than half of the 2000 ms "
                                         "an agent may stay silent"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("timeout of at most 1000 ms"), std::string::npos)
        << e.what();
  }
}

// Another agent claimed the job's end but has not written it yet when the
// leader finds node 1 silent: the leader waits for that end, rather than
// taking the missing value for a malformed one.
TEST_F(CoordinatorTest, TheLeaderWaitsForAnEndAnotherAgentClaimed) {
  TcpStore other_agent("127.0.0.1", server_.port(), kToken, 1'000);
  auto n0 = node(0), n1 = node(1);
  n1->coordinator->poll(0);
  other_agent.add("brigade/coord/end/claims", 1);
  int64_t t = 0;
  for (; t <= 2'100 * kMs; t += 100 * kMs) {
    EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  other_agent.set(
      "brigade/coord/end",
      R"({"kind": "signal", "node": 1, "what": "the launcher of node 1 received SIGINT"})");
  const JobView v = n0->coordinator->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.why, "the launcher of node 1 received SIGINT");
  EXPECT_TRUE(v.signal);
}

// An agent claimed the end and died before it wrote it: after the silence
// that makes an agent lost, the leader's own end stands.
TEST_F(CoordinatorTest, AnEndClaimedButNeverWrittenGivesWayToTheLeadersAfterTwoSeconds) {
  TcpStore other_agent("127.0.0.1", server_.port(), kToken, 1'000);
  auto n0 = node(0), n1 = node(1);
  n1->coordinator->poll(0);
  other_agent.add("brigade/coord/end/claims", 1);
  int64_t t = 0;
  // Node 1 found lost at 2100 ms; the claim's end awaited until 4100 ms.
  for (; t <= 4'100 * kMs; t += 100 * kMs) {
    EXPECT_EQ(n0->coordinator->poll(t).state, State::kRunning) << t / kMs;
  }
  const JobView v = n0->coordinator->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_NE(v.why.find("node 1 is lost"), std::string::npos) << v.why;
  EXPECT_EQ(n1->coordinator->poll(t).lost_node, 1);
}

TEST_F(CoordinatorTest, AStoreThatNoLongerAnswersEndsTheJobForTheAgent) {
  Node n1(server_.port(), 2, 1, 3, 0, /*call_timeout_ms=*/300);
  EXPECT_EQ(n1.coordinator->poll(kMs).state, State::kRunning);
  server_.stop();
  const JobView v = n1.coordinator->poll(2 * kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_TRUE(v.lost_coordinator);
  EXPECT_NE(v.why.find("lost contact with the coordinator's store at 127.0.0.1:"),
            std::string::npos)
      << v.why;
}

TEST_F(CoordinatorTest, ALaunchersSignalEndsTheJobEverywhereWithoutARestart) {
  auto n0 = node(0), n1 = node(1);
  n1->coordinator->report_end("the launcher of node 1 received SIGINT");
  for (auto* n : {n0.get(), n1.get()}) {
    const JobView v = n->coordinator->poll(kMs);
    ASSERT_EQ(v.state, State::kEnded);
    EXPECT_EQ(v.why, "the launcher of node 1 received SIGINT");
    EXPECT_TRUE(v.signal);
    EXPECT_FALSE(v.cause);
  }
  // The first end stays the end.
  n0->coordinator->report_end("later");
  EXPECT_EQ(n1->coordinator->poll(2 * kMs).why, "the launcher of node 1 received SIGINT");
}

// A holder of the token writes what no agent would: refused with the key
// named, never taken for a decision.
TEST_F(CoordinatorTest, MalformedValuesFromATokenHolderAreRefusedNamingTheKey) {
  struct Case {
    std::string key, value, expect;
  };
  const std::vector<Case> cases = {
      {"brigade/coord/agent/1/beat", "lots", "not a non-negative decimal number"},
      {"brigade/coord/gen/0/reports", "-1", "not a non-negative decimal number"},
      {"brigade/coord/end", "[1, 2]", "not the end of the job"},
      {"brigade/coord/end", R"({"kind": "node_lost", "node": 7, "what": "x"})",
       "not the end of the job"},
  };
  for (const Case& c : cases) {
    TcpStoreServer server("127.0.0.1", 0, kToken);
    TcpStore stranger("127.0.0.1", server.port(), kToken, 5'000);
    Node n0(server.port(), 2, 0, 3, 0);
    Node n1(server.port(), 2, 1, 3, 0);
    stranger.set(c.key, c.value);
    const JobView v = n0.coordinator->poll(kMs);
    ASSERT_EQ(v.state, State::kEnded) << c.key;
    EXPECT_FALSE(v.lost_coordinator);
    EXPECT_NE(v.why.find("the coordinator key '" + c.key + "' holds"), std::string::npos) << v.why;
    EXPECT_NE(v.why.find(c.expect), std::string::npos) << v.why;
    EXPECT_NE(v.why.find("refusing it"), std::string::npos) << v.why;
  }
}

TEST_F(CoordinatorTest, AMalformedReportOrGenerationIsNeverActedOn) {
  TcpStore stranger("127.0.0.1", server_.port(), kToken, 5'000);
  auto n0 = node(0), n1 = node(1);
  // A report whose kind no agent writes, counted as if real.
  stranger.set("brigade/coord/gen/0/failure/1",
               R"({"kind": "reboot", "rank": 1, "node": 1, "pid": 5, "what": "x",
                   "injected": false, "detected_after_ms": 1, "last_step": 0,
                   "mean_step_ms": 0})");
  stranger.add("brigade/coord/gen/0/reports", 1);
  n0->coordinator->report_stopped(false);
  n1->coordinator->report_stopped(false);
  const JobView v = n0->coordinator->poll(kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("'brigade/coord/gen/0/failure/1' holds"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("not a failure report"), std::string::npos) << v.why;

  // An open generation that is not the next one.
  TcpStoreServer server("127.0.0.1", 0, kToken);
  TcpStore other("127.0.0.1", server.port(), kToken, 5'000);
  Node m1(server.port(), 2, 1, 3, 0);
  m1.coordinator->report_failure(crash(2, false, true));
  other.set("brigade/coord/gen/1/open", "7");
  const JobView w = m1.coordinator->poll(kMs);
  ASSERT_EQ(w.state, State::kEnded);
  EXPECT_NE(w.why.find("'brigade/coord/gen/1/open' holds '7', not generation 1"), std::string::npos)
      << w.why;
  EXPECT_THROW(m1.coordinator->enter_next_generation(), Error);
}

// Only the job's token opens the store the coordinator lives in.
TEST_F(CoordinatorTest, AClientWithoutTheTokenCannotReachTheCoordinatorsKeys) {
  EXPECT_THROW(TcpStore("127.0.0.1", server_.port(), "not-the-token", 1'000), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

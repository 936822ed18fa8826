// Standby nodes (elastic/standby.h): the leader's choice among them, and the
// coordinator giving a lost node's rank to one (elastic/coordinator.h). As
// in coordinator_test.cc, every agent is a Coordinator over its own client
// of one real TcpStore, and time is passed in by the test. End to end:
// tests/cli/elastic_nodes_test.cc (loopback) and
// tests/cli/elastic_nodes_cluster_test.cc (namespace nodes).
#include "brigade/elastic/standby.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/comm/tcp_store.h"
#include "brigade/core/error.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kMs = 1'000'000;
constexpr char kToken[] = "standby-test-token";
using State = JobView::State;

struct Agent {
  Agent(uint16_t port, int nnodes, int rank, bool standby, int64_t now)
      : client("127.0.0.1", port, kToken, 1'000), store(client) {
    CoordinatorOptions o;
    o.nnodes = nnodes;
    o.node_rank = rank;
    o.max_restarts = 3;
    o.standby = standby;
    coordinator = std::make_unique<Coordinator>(store, o, now);
  }
  JobView poll(int64_t t) { return coordinator->poll(t); }
  TcpStore client;
  TcpCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

class StandbyTest : public ::testing::Test {
 protected:
  std::unique_ptr<Agent> node(int rank, int nnodes = 2) {
    return std::make_unique<Agent>(server_.port(), nnodes, rank, false, 0);
  }
  std::unique_ptr<Agent> standby(int nnodes = 2) {
    return std::make_unique<Agent>(server_.port(), nnodes, 0, true, 0);
  }
  // Polls `agents` in this order every 100 ms from `t` to `until` (the
  // leader last: it reads what the others wrote); the time after.
  static int64_t poll_each(const std::vector<Agent*>& agents, int64_t t, int64_t until) {
    for (; t <= until; t += 100 * kMs) {
      for (Agent* a : agents) a->poll(t);
    }
    return t;
  }
  // Polls `others`, then the leader, every 100 ms from `t` while the
  // leader's view is `state`, up to `until`; the leader's last view (`t`
  // is the time after it).
  static JobView poll_while(const std::vector<Agent*>& others, Agent& leader, int64_t& t,
                            int64_t until, State state) {
    JobView v;
    for (; v.state == state && t <= until; t += 100 * kMs) {
      for (Agent* a : others) a->poll(t);
      v = leader.poll(t);
    }
    return v;
  }
  TcpStoreServer server_{"127.0.0.1", 0, kToken};
  TcpStore raw_{"127.0.0.1", server_.port(), kToken, 1'000};
  TcpCoordinatorStore raw_store_{raw_};
};

// The pool alone: a standby is chosen only if the leader saw its beat move
// within agent_timeout_ms, and only once.
TEST_F(StandbyTest, ThePoolPicksOnlyAFreeStandbyWhoseBeatMovedRecently) {
  StandbyPool pool(raw_store_, 2'000);
  const auto beat = [&](int s) { raw_store_.add(standby_beat_key(s), 1); };
  const auto first = [&](int64_t t) -> std::optional<int> {
    const std::vector<int> free = pool.pick(t, 1);
    if (free.empty()) return std::nullopt;
    return free[0];
  };
  raw_store_.add(standby_count_key(), 2);
  beat(0);
  beat(1);
  pool.watch(0);
  // Registered, but neither beat has moved under the leader's eyes yet: a
  // registered standby may have died right after.
  EXPECT_EQ(first(0), std::nullopt);
  beat(1);
  pool.watch(100 * kMs);
  EXPECT_EQ(first(100 * kMs), 1);
  EXPECT_EQ(first(2'100 * kMs), 1);  // 2 s after its last beat: still in time
  EXPECT_EQ(first(2'101 * kMs), std::nullopt) << "silent for more than 2 s";
  beat(0);
  beat(1);
  pool.watch(3'000 * kMs);
  EXPECT_EQ(pool.pick(3'000 * kMs, 3), (std::vector<int>{0, 1}));
  pool.assign(0, 1, 4);
  EXPECT_EQ(first(3'000 * kMs), 1) << "standby 0 is taken";
  EXPECT_EQ(read_assignment(raw_store_, 0, 2)->node, 1);
  EXPECT_EQ(read_assignment(raw_store_, 0, 2)->generation, 4);
  EXPECT_EQ(read_assignment(raw_store_, 1, 2), std::nullopt);
  // Node 0 is the leader, never given away; a node outside the job neither.
  // A beat counts on past a million (55 hours at 5 a second).
  raw_store_.set(standby_beat_key(1), "2000000");
  pool.watch(3'100 * kMs);
  EXPECT_EQ(pool.pick(3'100 * kMs, 1), std::vector<int>{1});
  raw_store_.set(standby_count_key(), "2000000");
  EXPECT_THROW(pool.watch(3'200 * kMs), MalformedValue) << "no job has 2 million standbys";
  for (const char* bad : {"0 1", "2 1", "1 0", "1", "1 1 x", "one 1"}) {
    raw_store_.set(standby_node_key(1), bad);
    EXPECT_THROW(read_assignment(raw_store_, 1, 2), MalformedValue) << bad;
  }
}

// Node 1's agent falls silent with a standby beating: the job does not end.
// Node 0 stops its workers, the standby is given node 1 for generation 1,
// which opens once node 0's workers are reaped; the incident is node 1's.
TEST_F(StandbyTest, ALostNodesRankGoesToALiveStandbyInTheNextGeneration) {
  auto n0 = node(0), n1 = node(1), s = standby();
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    n1->poll(t);
    EXPECT_EQ(s->poll(t).state, State::kRunning);
    EXPECT_EQ(n0->poll(t).state, State::kRunning);
  }
  // Node 1 is silent from here (its last beat at 1000 ms).
  for (; t <= 3'000 * kMs; t += 100 * kMs) {
    EXPECT_EQ(s->poll(t).state, State::kRunning);
    EXPECT_EQ(n0->poll(t).state, State::kRunning) << t / kMs;
  }
  EXPECT_EQ(s->poll(t).state, State::kRunning);
  JobView v = n0->poll(t);  // the loss is a report: node 0 stops its workers
  EXPECT_EQ(n0->poll(t += 100 * kMs).state, State::kFailing);
  EXPECT_TRUE(n0->poll(t).will_restart);
  // Not given before the survivors' workers are gone.
  EXPECT_EQ(s->poll(t).state, State::kRunning);
  EXPECT_EQ(s->coordinator->node_rank(), -1);
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);  // decides
  v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart);
  ASSERT_TRUE(v.cause);
  EXPECT_EQ(v.cause->kind, "node_lost");
  EXPECT_EQ(v.cause->node, 1);
  EXPECT_EQ(v.cause->rank, -1);
  EXPECT_FALSE(v.cause->injected);
  EXPECT_NE(v.cause->what.find("node 1 is lost: its agent sent no heartbeat for 2.1 s"),
            std::string::npos)
      << v.cause->what;
  EXPECT_NE(v.cause->what.find("standby 0 takes its place as node 1 in generation 1"),
            std::string::npos)
      << v.cause->what;
  EXPECT_NEAR(v.cause->detected_after_ms(), 2'100.0, 0.01);
  const JobView given = s->poll(t);
  ASSERT_EQ(given.state, State::kRestart);
  EXPECT_EQ(s->coordinator->node_rank(), 1);
  EXPECT_EQ(s->coordinator->generation(), 1);
  EXPECT_FALSE(s->coordinator->standby());
  n0->coordinator->enter_next_generation();

  // Generation 1: the leader watches the standby's beat, not node 1's old
  // key, which a stale writer may still move.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(s->poll(t += 100 * kMs).state, State::kRunning);
    EXPECT_EQ(n0->poll(t).state, State::kRunning);
  }
  // (The standby beats every 200 ms: its last beat was 0-200 ms ago.)
  for (int i = 0; i < 18; ++i) {
    raw_store_.add(coordinator_key("agent/1/beat"), 1);
    v = n0->poll(t += 100 * kMs);
  }
  EXPECT_EQ(v.state, State::kRunning) << "1.8 s after the standby's last poll: not yet lost";
  for (int i = 0; i < 5 && v.state == State::kRunning; ++i) {
    raw_store_.add(coordinator_key("agent/1/beat"), 1);
    v = n0->poll(t += 100 * kMs);
  }
  ASSERT_EQ(v.state, State::kEnded) << "the standby, now node 1, went silent";
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_NE(v.why.find("no standby node is free (of 1 registered"), std::string::npos) << v.why;
}

// The lost node's agent comes back (it was stopped, or its network came
// back): it ends for itself without writing, never runs generation 1, and
// an end it claimed before it knew is not the job's.
TEST_F(StandbyTest, ALostNodesAgentThatComesBackCannotDisturbTheNextGeneration) {
  auto n0 = node(0), n1 = node(1), s = standby();
  int64_t t = 0;
  t = poll_each({n1.get(), s.get(), n0.get()}, t, 1'000 * kMs);
  t = poll_each({s.get(), n0.get()}, t, 3'100 * kMs);
  ASSERT_EQ(n0->poll(t).state, State::kFailing);
  // Before it learns it is lost, node 1's agent ended the job for everyone
  // (it had lost the leader, from its side).
  raw_store_.add(coordinator_key("end/claims"), 1);
  raw_store_.set(coordinator_key("end"), nlohmann::json{{"kind", "coordinator_lost"},
                                                        {"node", 1},
                                                        {"generation", 0},
                                                        {"what", "node 1 lost the coordinator"},
                                                        {"by", 1},
                                                        {"by_generation", 0}}
                                             .dump());
  const std::string beat_before = *raw_store_.try_get(coordinator_key("agent/1/beat"));
  const JobView back = n1->poll(t += 100 * kMs);
  ASSERT_EQ(back.state, State::kEnded);
  EXPECT_TRUE(back.lost_coordinator);
  EXPECT_NE(back.why.find("declared node 1 lost in generation 0"), std::string::npos) << back.why;
  EXPECT_EQ(*raw_store_.try_get(coordinator_key("agent/1/beat")), beat_before)
      << "a lost agent beats no more";
  // Nor does it report, stop, or end anything.
  Incident hang;
  hang.kind = "hang";
  hang.rank = 2;
  hang.what = "rank 2 is stuck";
  n1->coordinator->report_failure(hang);
  n1->coordinator->report_stopped(false);
  n1->coordinator->report_end("the launcher of node 1 received SIGTERM");
  n1->coordinator->mark_node_fault("kill-agent");
  EXPECT_FALSE(raw_store_.try_get(coordinator_key("gen/0/stopped/1")));
  EXPECT_FALSE(raw_store_.try_get(coordinator_key("gen/0/failure/1")));
  EXPECT_FALSE(raw_store_.try_get(coordinator_key("gen/0/node_fault/1")));
  EXPECT_EQ(raw_store_.add(coordinator_key("end/claims"), 0), 1);
  EXPECT_EQ(s->poll(t).state, State::kRunning) << "the stale end is not the job's";
  EXPECT_EQ(n0->poll(t).state, State::kFailing) << "the stale end is not the job's";
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  EXPECT_EQ(n0->poll(t += 100 * kMs).state, State::kRestart);
  EXPECT_EQ(s->poll(t).state, State::kRestart);
  EXPECT_EQ(n1->poll(t).state, State::kEnded) << "node 1's old agent never sees generation 1";
  EXPECT_THROW(n1->coordinator->enter_next_generation(), Error);
}

// A registered standby whose beat the leader never saw move (it died just
// after registering) is never given a node: the job ends naming node 1.
TEST_F(StandbyTest, AStandbyThatStoppedBeatingIsNeverGivenANode) {
  auto n0 = node(0), n1 = node(1), s = standby();
  int64_t t = 0;
  t = poll_each({n1.get(), n0.get()}, t, 1'000 * kMs);
  JobView v;
  for (; t <= 3'200 * kMs && v.state != State::kEnded; t += 100 * kMs) v = n0->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_NE(v.why.find("no standby node is free (of 1 registered, none unused with a heartbeat"),
            std::string::npos)
      << v.why;
  EXPECT_FALSE(raw_store_.try_get(standby_node_key(0)));
  // The standby hears of the end.
  const JobView ended = s->poll(t);
  EXPECT_EQ(ended.state, State::kEnded);
}

// A node that cut its own network said so first: its loss is recorded as a
// partition, injected.
TEST_F(StandbyTest, AnInjectedPartitionIsTheIncidentsKind) {
  auto n0 = node(0), n1 = node(1), s = standby();
  int64_t t = 0;
  t = poll_each({n1.get(), s.get(), n0.get()}, t, 1'000 * kMs);
  n1->coordinator->mark_node_fault("partition");
  t = poll_each({s.get(), n0.get()}, t, 3'200 * kMs);
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  const JobView v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart);
  EXPECT_EQ(v.cause->kind, "partition");
  EXPECT_TRUE(v.cause->injected);
  EXPECT_EQ(v.cause->node, 1);
}

// The only standby dies between the leader's detection of node 1 and its
// decision: node 0 ends the job naming node 1, and node 2 takes that end
// (node 0 wrote it, though it names a node declared lost).
TEST_F(StandbyTest, AStandbyThatDiesBeforeTheDecisionEndsTheJobForEveryNode) {
  auto n0 = node(0, 3), n1 = node(1, 3), n2 = node(2, 3), s = standby(3);
  int64_t t = 0;
  t = poll_each({n1.get(), n2.get(), s.get(), n0.get()}, t, 1'000 * kMs);
  JobView v = poll_while({n2.get(), s.get()}, *n0, t, 4'000 * kMs, State::kRunning);
  ASSERT_EQ(n0->poll(t).state, State::kFailing) << "node 1 is lost and the standby free";
  ASSERT_EQ(raw_store_.try_get(coordinator_key("node/1/lost")), "0");
  // The standby beats no more; node 2 stops its workers.
  ASSERT_EQ(n2->poll(t).state, State::kFailing);
  for (int i = 0; i < 22; ++i) {
    n2->poll(t += 100 * kMs);
    v = n0->poll(t);
  }
  // The survivors' workers are reaped after 2.2 s without a standby beat.
  n2->coordinator->report_stopped(false);
  n0->coordinator->report_stopped(false);
  v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_NE(v.why.find("0 of the 1 lost nodes (1) can have a standby"), std::string::npos) << v.why;
  const JobView other = n2->poll(t += 100 * kMs);
  ASSERT_EQ(other.state, State::kEnded) << "node 0's end stands for node 2";
  EXPECT_EQ(other.lost_node, 1);
  EXPECT_EQ(s->poll(t).state, State::kEnded);
  EXPECT_FALSE(raw_store_.try_get(standby_node_key(0)));
}

// Nodes 1 and 2 fall silent together with one standby: the first is
// marked lost, the second ends the job at once, and the end names both
// (node 0's launcher waits for neither).
TEST_F(StandbyTest, TwoNodesLostWithOneStandbyEndTheJobNamingBoth) {
  auto n0 = node(0, 3), n1 = node(1, 3), n2 = node(2, 3), s = standby(3);
  int64_t t = 0;
  t = poll_each({n1.get(), n2.get(), s.get(), n0.get()}, t, 1'000 * kMs);
  JobView v = poll_while({s.get()}, *n0, t, 4'000 * kMs, State::kRunning);
  ASSERT_EQ(v.state, State::kEnded) << "ended as both are found silent";
  EXPECT_EQ(v.lost_node, 2);
  EXPECT_EQ(v.lost_nodes, (std::vector<int>{2, 1}));
  EXPECT_EQ(s->poll(t).state, State::kEnded);
  EXPECT_FALSE(raw_store_.try_get(standby_node_key(0)));
}

// Two nodes lost, two standbys free when found; one of them dies before
// the decision: neither is given a node (half a replacement is none), and
// the job ends naming both lost nodes.
TEST_F(StandbyTest, NoStandbyIsGivenANodeUnlessEveryLostNodeHasOne) {
  auto n0 = node(0, 3), n1 = node(1, 3), n2 = node(2, 3), s0 = standby(3), s1 = standby(3);
  int64_t t = 0;
  t = poll_each({n1.get(), n2.get(), s0.get(), s1.get(), n0.get()}, t, 1'000 * kMs);
  JobView v = poll_while({s0.get(), s1.get()}, *n0, t, 4'000 * kMs, State::kRunning);
  ASSERT_EQ(n0->poll(t).state, State::kFailing);
  EXPECT_TRUE(raw_store_.try_get(coordinator_key("node/2/lost")));
  // Standby 1 stops beating; node 0's workers are reaped 2.2 s later.
  for (int i = 0; i < 22; ++i) {
    s0->poll(t += 100 * kMs);
    n0->poll(t);
  }
  n0->coordinator->report_stopped(false);
  v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("1 of the 2 lost nodes (1, 2) can have a standby"), std::string::npos)
      << v.why;
  EXPECT_EQ(v.lost_nodes, (std::vector<int>{1, 2}));
  EXPECT_FALSE(raw_store_.try_get(standby_node_key(0))) << "half a replacement";
  EXPECT_FALSE(raw_store_.try_get(standby_node_key(1)));
  EXPECT_EQ(s0->poll(t).state, State::kEnded);
}

// A stale end (written by node 1 before it was declared lost) does not use
// up the one end: the next end written replaces it.
TEST_F(StandbyTest, AnEndAfterALostNodesStaleEndReplacesIt) {
  auto n0 = node(0), n1 = node(1), s = standby();
  int64_t t = 0;
  t = poll_each({n1.get(), s.get(), n0.get()}, t, 1'000 * kMs);
  t = poll_each({s.get(), n0.get()}, t, 3'100 * kMs);
  ASSERT_EQ(n0->poll(t).state, State::kFailing);
  raw_store_.add(coordinator_key("end/claims"), 1);
  raw_store_.set(coordinator_key("end"), nlohmann::json{{"kind", "coordinator_lost"},
                                                        {"node", 1},
                                                        {"generation", 0},
                                                        {"what", "node 1 lost the coordinator"},
                                                        {"by", 1},
                                                        {"by_generation", 0}}
                                             .dump());
  n0->coordinator->report_end("the launcher of node 0 received SIGTERM");
  const JobView v = s->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.why, "the launcher of node 0 received SIGTERM");
}

// Standby 0 is given node 1 but hangs before it starts: the leader finds
// node 1 silent again in generation 1 and gives it to standby 1. Standby 0,
// back, leaves instead of starting node 1's workers of generation 1.
TEST_F(StandbyTest, AStandbyGivenANodeTooLateLeaves) {
  auto n0 = node(0), n1 = node(1), s0 = standby(), s1 = standby();
  int64_t t = 0;
  t = poll_each({n1.get(), s0.get(), s1.get(), n0.get()}, t, 1'000 * kMs);
  JobView v;
  for (; v.state != State::kFailing && t <= 4'000 * kMs; t += 100 * kMs) {
    s0->poll(t);
    s1->poll(t);
    v = n0->poll(t);
  }
  ASSERT_EQ(v.state, State::kFailing);
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  ASSERT_EQ(n0->poll(t += 100 * kMs).state, State::kRestart);
  ASSERT_EQ(read_assignment(raw_store_, 0, 2)->node, 1) << "standby 0 was given node 1";
  n0->coordinator->enter_next_generation();
  // Standby 0 is stopped from here; standby 1 beats on.
  for (v = JobView{}; v.state != State::kFailing && t <= 8'000 * kMs; t += 100 * kMs) {
    s1->poll(t);
    v = n0->poll(t);
  }
  ASSERT_EQ(v.state, State::kFailing);
  EXPECT_EQ(raw_store_.try_get(coordinator_key("node/1/lost")), "1");
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  ASSERT_EQ(n0->poll(t += 100 * kMs).state, State::kRestart);
  ASSERT_EQ(s1->poll(t).state, State::kRestart);
  EXPECT_EQ(s1->coordinator->generation(), 2);
  const JobView late = s0->poll(t);
  ASSERT_EQ(late.state, State::kEnded);
  EXPECT_TRUE(late.lost_coordinator);
  EXPECT_NE(late.why.find("standby 0 was given node 1 in generation 1 but started too late"),
            std::string::npos)
      << late.why;
  EXPECT_EQ(s0->coordinator->node_rank(), -1);
}

// The job's end releases a standby that waited in vain.
TEST_F(StandbyTest, AWaitingStandbyIsReleasedAtTheEnd) {
  auto n0 = node(0), s = standby();
  EXPECT_EQ(s->poll(100 * kMs).state, State::kRunning);
  n0->coordinator->release_standbys();
  EXPECT_EQ(s->poll(200 * kMs).state, State::kSucceeded);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

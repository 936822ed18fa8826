// Rejoining (scale up, elastic/coordinator_rejoin.cc): a job that went on
// with fewer nodes grows back when a joiner (a standby) is there. As in
// fewer_nodes_test.cc, every agent is a Coordinator over its own client of
// one real TcpStore, and time is passed in by the test. End to end,
// training included: tests/cli/elastic_rejoin_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/tcp_store.h"
#include "brigade/elastic/coordinator.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kMs = 1'000'000;
constexpr char kToken[] = "rejoin-test-token";
using State = JobView::State;

struct Agent {
  Agent(uint16_t port, CoordinatorOptions o)
      : client("127.0.0.1", port, kToken, 1'000), store(client) {
    coordinator = std::make_unique<Coordinator>(store, o, 0);
  }
  JobView poll(int64_t t) { return coordinator->poll(t); }
  TcpStore client;
  TcpCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

class RejoinTest : public ::testing::Test {
 protected:
  // A node of 3 at --nnodes 2:3; node 0 knows the layout dp 3, grad_accum 2.
  std::unique_ptr<Agent> node(int rank, int max_restarts = 3) {
    CoordinatorOptions o = options(max_restarts);
    o.node_rank = rank;
    o.host = "h" + std::to_string(rank);
    return std::make_unique<Agent>(server_.port(), o);
  }
  std::unique_ptr<Agent> joiner(const std::string& host, int max_restarts = 3) {
    CoordinatorOptions o = options(max_restarts);
    o.standby = true;
    o.host = host;
    return std::make_unique<Agent>(server_.port(), o);
  }
  static CoordinatorOptions options(int max_restarts) {
    CoordinatorOptions o;
    o.nnodes = 3;
    o.min_nnodes = 2;
    o.train_dp = 3;
    o.train_grad_accum = 2;
    o.max_restarts = max_restarts;
    return o;
  }
  // Polls every agent in `live` each 100 ms from t until `until`.
  static void run(const std::vector<Agent*>& live, int64_t& t, int64_t until) {
    for (; t <= until; t += 100 * kMs) {
      for (Agent* a : live) a->poll(t);
    }
  }
  // Polls `live` until the leader (live[0]) says the generation fails;
  // false if it never does within `limit_ms`.
  static bool run_until_failing(const std::vector<Agent*>& live, int64_t& t, int64_t limit_ms) {
    for (const int64_t end = t + limit_ms * kMs; t <= end; t += 100 * kMs) {
      for (Agent* a : live) {
        if (a->poll(t).state == State::kFailing && a == live[0]) return true;
      }
    }
    return false;
  }
  // Every agent in `stopping` says its workers are gone; the leader
  // decides; every agent in `live` (a joiner included) sees the next
  // generation open and enters it. Returns each one's view.
  static std::vector<JobView> open_next(const std::vector<Agent*>& stopping,
                                        const std::vector<Agent*>& live, int64_t& t) {
    for (Agent* a : stopping) a->coordinator->report_stopped(false);
    stopping[0]->poll(t += 100 * kMs);  // the leader decides
    t += 100 * kMs;
    std::vector<JobView> views;
    for (Agent* a : live) {
      views.push_back(a->poll(t));
      // A joiner given a node is in its generation already.
      if (views.back().state == State::kRestart &&
          std::find(stopping.begin(), stopping.end(), a) != stopping.end()) {
        a->coordinator->enter_next_generation();
      }
    }
    return views;
  }
  // Nodes 0, 1, 2 run; node 1 falls silent and the job goes on with 0 and 2.
  void lose_node_1(Agent* n0, Agent* n1, Agent* n2, int64_t& t) {
    run({n0, n1, n2}, t, t + 1'000 * kMs);
    ASSERT_TRUE(run_until_failing({n0, n2}, t, 4'000));
    ASSERT_EQ(n2->poll(t).state, State::kFailing);
    const std::vector<JobView> v = open_next({n0, n2}, {n0, n2}, t);
    ASSERT_EQ(v[0].state, State::kRestart) << v[0].why;
    ASSERT_EQ(v[0].cause->kind, "node_lost");
    ASSERT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
  }
  TcpStoreServer server_{"127.0.0.1", 0, kToken};
  TcpStore raw_{"127.0.0.1", server_.port(), kToken, 1'000};
};

// 3 nodes at 2:3 lose node 1 and run on {0, 2} at dp 2, grad_accum 3. A
// joiner starts: once it has beaten for the settle time (not before) the
// leader stops the job for a rejoin, gives the joiner node rank 1, and
// generation 2 runs on all 3 nodes at node 0's own layout (dp 3,
// grad_accum 2: no train_layout), waiting for the joiner's workers too.
TEST_F(RejoinTest, AJoinerTakesTheLeftOutNodeBackAndTheLayoutScalesBackUp) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  ASSERT_TRUE(n2->coordinator->train_layout());
  EXPECT_EQ(n2->coordinator->train_layout()->dp, 2);
  EXPECT_EQ(n2->coordinator->train_layout()->grad_accum, 3);
  auto s = joiner("h9");
  const int64_t joined = t;
  // Not settled yet: a joiner that just started stops nobody.
  run({n0.get(), n2.get(), s.get()}, t, joined + 1'500 * kMs);
  EXPECT_EQ(n0->poll(t).state, State::kRunning);
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), s.get()}, t, 3'000));
  EXPECT_LE(t - joined, 3'000 * kMs);
  const JobView failing = n2->poll(t);
  ASSERT_EQ(failing.state, State::kFailing);
  EXPECT_TRUE(failing.rejoin);
  EXPECT_TRUE(failing.will_restart);
  ASSERT_EQ(s->poll(t).state, State::kRunning);  // waits for the others to stop
  const std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  for (const JobView& v : views) {
    ASSERT_EQ(v.state, State::kRestart) << v.why;
    ASSERT_TRUE(v.cause);
    EXPECT_EQ(v.cause->kind, "rejoin");
    EXPECT_EQ(v.cause->node, 1);
    EXPECT_EQ(v.cause->nodes, 3);
    EXPECT_NE(v.cause->what.find("node 1 rejoins: standby 0 takes its place from generation 2, "
                                 "the job grows back to 3 of its 3 nodes; no restart used"),
              std::string::npos)
        << v.cause->what;
  }
  for (Agent* a : {n0.get(), n2.get()}) {
    EXPECT_EQ(a->coordinator->generation(), 2);
    EXPECT_EQ(a->coordinator->members(), (std::vector<int>{0, 1, 2}));
    EXPECT_FALSE(a->coordinator->train_layout());   // node 0's own: dp 3, grad_accum 2
    EXPECT_EQ(a->coordinator->restarts_used(), 1);  // the loss only
  }
  EXPECT_EQ(n2->coordinator->member_index(), 2);
  const JobView took = s->poll(t);
  ASSERT_EQ(took.state, State::kRestart) << took.why;
  EXPECT_EQ(s->coordinator->node_rank(), 1);
  EXPECT_EQ(s->coordinator->generation(), 2);
  EXPECT_EQ(s->coordinator->member_index(), 1);
  EXPECT_EQ(s->coordinator->member_count(), 3);
  EXPECT_FALSE(s->coordinator->train_layout());
  EXPECT_EQ(s->coordinator->restarts_used(), 1);
  EXPECT_TRUE(n0->coordinator->nodes_lost_unreplaced().empty());
  // Node 1's old agent, back, is still out.
  EXPECT_EQ(n1->poll(t).state, State::kEnded);
  // Generation 2 succeeds only once the joiner's workers are done too.
  n0->coordinator->report_stopped(true);
  n2->coordinator->report_stopped(true);
  EXPECT_EQ(n0->poll(t += 100 * kMs).state, State::kRunning);
  s->coordinator->report_stopped(true);
  EXPECT_EQ(n0->poll(t += 100 * kMs).state, State::kSucceeded);
  EXPECT_EQ(s->poll(t).state, State::kSucceeded);
}

// max_restarts 2: the loss uses one, the rejoin none, so a crash after the
// rejoin still restarts the job (counted as the generation, it would end).
TEST_F(RejoinTest, ARejoinUsesNoRestart) {
  auto n0 = node(0, 2), n1 = node(1, 2), n2 = node(2, 2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  auto s = joiner("h9", 2);
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), s.get()}, t, 4'000));
  open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(s->poll(t).state, State::kRestart);
  ASSERT_EQ(n0->coordinator->generation(), 2);
  Incident crash;
  crash.kind = "crash";
  crash.rank = 2;
  crash.what = "worker rank 2 exited with status 1";
  s->coordinator->report_failure(crash);
  const JobView failing = n2->poll(t += 100 * kMs);
  ASSERT_EQ(failing.state, State::kFailing);
  EXPECT_FALSE(failing.rejoin);
  EXPECT_TRUE(failing.will_restart);
  ASSERT_EQ(n0->poll(t).state, State::kFailing);
  const std::vector<JobView> views =
      open_next({n0.get(), s.get(), n2.get()}, {n0.get(), n2.get(), s.get()}, t);
  for (const JobView& v : views) {
    ASSERT_EQ(v.state, State::kRestart) << v.why;
    EXPECT_EQ(v.cause->kind, "crash");
  }
  EXPECT_EQ(n0->coordinator->restarts_used(), 2);
  // The third node still there: the crash left nobody out.
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 1, 2}));
}

// A machine lost twice is quarantined: node 1's machine h1 is lost, rejoins,
// is lost again; its next joiner is refused with the reason and the job is
// not stopped for it; a joiner on another machine takes node 1 back.
TEST_F(RejoinTest, AMachineLostTwiceIsRefusedAndAnotherTakesItsPlace) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  auto back = joiner("h1");
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), back.get()}, t, 4'000));
  open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(back->poll(t).state, State::kRestart);
  ASSERT_EQ(back->coordinator->node_rank(), 1);
  // h1 fails again: lost a second time, the job goes on with {0, 2}.
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get()}, t, 4'000));
  std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(views[0].state, State::kRestart) << views[0].why;
  EXPECT_EQ(views[0].cause->kind, "node_lost");
  ASSERT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
  auto again = joiner("h1");
  JobView refused;
  for (const int64_t end = t + 6'000 * kMs; t <= end && refused.state != State::kEnded;
       t += 100 * kMs) {
    EXPECT_EQ(n0->poll(t).state, State::kRunning);
    EXPECT_EQ(n2->poll(t).state, State::kRunning);
    refused = again->poll(t);
  }
  ASSERT_EQ(refused.state, State::kEnded);
  EXPECT_TRUE(refused.lost_coordinator);
  EXPECT_NE(refused.why.find("standby 1 is refused: its machine 'h1' was declared lost 2 times in "
                             "this job, so it is quarantined and not readmitted"),
            std::string::npos)
      << refused.why;
  // The job is unharmed, and a fresh machine may join.
  auto fresh = joiner("h7");
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), fresh.get()}, t, 4'000));
  views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(views[0].state, State::kRestart);
  EXPECT_EQ(views[0].cause->kind, "rejoin");
  EXPECT_NE(views[0].cause->what.find("standby 2 takes its place"), std::string::npos)
      << views[0].cause->what;
  ASSERT_EQ(fresh->poll(t).state, State::kRestart);
  EXPECT_EQ(fresh->coordinator->node_rank(), 1);
}

// A loss counts against the machine that held the node then: node 1's own
// machine h1 lost once, the joiner on h5 that took its place lost once, a
// joiner on h1 is admitted (each machine lost once only).
TEST_F(RejoinTest, ALossCountsAgainstTheMachineThatHeldTheNode) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  auto other = joiner("h5");
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), other.get()}, t, 4'000));
  open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(other->poll(t).state, State::kRestart);
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get()}, t, 4'000));  // h5 lost
  open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
  auto back = joiner("h1");
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), back.get()}, t, 4'000));
  const std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(views[0].state, State::kRestart) << views[0].why;
  EXPECT_EQ(views[0].cause->kind, "rejoin");
  const JobView took = back->poll(t);
  ASSERT_EQ(took.state, State::kRestart) << took.why;
  EXPECT_EQ(back->coordinator->node_rank(), 1);
}

// With every node in the job a joiner only waits, as a standby: nothing is
// stopped for it, however long it beats.
TEST_F(RejoinTest, AJoinerWhileTheJobIsAtFullSizeWaitsAsAStandby) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  auto s = joiner("h9");
  int64_t t = 0;
  for (; t <= 8'000 * kMs; t += 100 * kMs) {
    for (Agent* a : {n0.get(), n1.get(), n2.get()}) ASSERT_EQ(a->poll(t).state, State::kRunning);
    ASSERT_EQ(s->poll(t).state, State::kRunning);
  }
  EXPECT_FALSE(raw_.check({coordinator_key("gen/0/rejoin")}));
  EXPECT_TRUE(s->coordinator->standby());
}

// A rejoin value no leader writes ends the job naming the key.
TEST_F(RejoinTest, AMalformedRejoinEndsTheJobNamingTheKey) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 500 * kMs);
  raw_.set(coordinator_key("gen/0/rejoin"), "0 7");
  raw_.add(coordinator_key("gen/0/reports"), 1);
  const JobView v = n1->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("'brigade/coord/gen/0/rejoin' holds '0 7', not 'STANDBY NODE' with NODE in "
                       "1..2"),
            std::string::npos)
      << v.why;
}

// Two nodes run workers during a rejoin's stop: node 2's workers agree on
// node 0's step boundary, save and exit 143 (128 + SIGTERM) before node
// 2's agent saw the rejoin, so its agent reports them as a crash. Still a
// rejoin: no restart used, the joiner admitted.
TEST_F(RejoinTest, WorkersThatExitOnTheRejoinsSigtermAreNoCrash) {
  auto n0 = node(0, 1), n1 = node(1, 1), n2 = node(2, 1);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  auto s = joiner("h9", 1);
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), s.get()}, t, 4'000));
  Incident saved;
  saved.kind = "crash";
  saved.rank = 1;
  saved.exit_code = 128 + SIGTERM;
  saved.what = "worker rank 1 (local 0, node 2) exited with status 143";
  n2->coordinator->report_failure(saved);
  const JobView failing = n2->poll(t += 100 * kMs);
  ASSERT_EQ(failing.state, State::kFailing);
  EXPECT_TRUE(failing.rejoin);
  EXPECT_TRUE(failing.will_restart);  // no restart left, but none needed
  const std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  for (const JobView& v : views) {
    ASSERT_EQ(v.state, State::kRestart) << v.why;
    EXPECT_EQ(v.cause->kind, "rejoin");
  }
  EXPECT_EQ(n0->coordinator->restarts_used(), 1);
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(s->poll(t).state, State::kRestart);
}

// A real crash reported while the job stops for a rejoin: no rejoin any
// more (the survivors get SIGKILL, not the signal's grace), and with no
// restart left the job ends with the crash, the joiner not admitted.
TEST_F(RejoinTest, ACrashDuringARejoinIsAFailure) {
  auto n0 = node(0, 1), n1 = node(1, 1), n2 = node(2, 1);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  auto s = joiner("h9", 1);
  ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), s.get()}, t, 4'000));
  ASSERT_TRUE(n2->poll(t).rejoin);
  Incident crash;
  crash.kind = "crash";
  crash.rank = 1;
  crash.exit_code = 1;
  crash.what = "worker rank 1 (local 0, node 2) exited with status 1";
  n2->coordinator->report_failure(crash);
  for (Agent* a : {n0.get(), n2.get()}) {
    const JobView v = a->poll(t += 100 * kMs);
    ASSERT_EQ(v.state, State::kFailing);
    EXPECT_FALSE(v.rejoin);
    EXPECT_FALSE(v.will_restart);
  }
  const std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
  ASSERT_EQ(views[0].state, State::kEnded);
  EXPECT_NE(views[0].why.find("exited with status 1"), std::string::npos) << views[0].why;
}

// A joiner that goes silent between the decision and the grow stopped the
// job for nothing: the rejoin is aborted (no member added), counted as a
// loss of its machine; twice, and that machine's next joiner is refused.
TEST_F(RejoinTest, AJoinerSilentBeforeTheGrowCountsAsALossOfItsMachine) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto flaky = joiner("h8");
    ASSERT_TRUE(run_until_failing({n0.get(), n2.get(), flaky.get()}, t, 4'000));
    flaky.reset();  // silent from now on
    run({n0.get(), n2.get()}, t, t + 2'500 * kMs);
    const std::vector<JobView> views = open_next({n0.get(), n2.get()}, {n0.get(), n2.get()}, t);
    ASSERT_EQ(views[0].state, State::kRestart) << views[0].why;
    EXPECT_EQ(views[0].cause->kind, "rejoin");
    EXPECT_NE(views[0].cause->what.find(fmt::format(
                  "rejoin aborted: standby {} went silent before it could rejoin as node 1, "
                  "which stays out; counted as a loss of its machine 'h8' ({} of the 2",
                  attempt - 1, attempt)),
              std::string::npos)
        << views[0].cause->what;
    EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
    EXPECT_EQ(n0->coordinator->restarts_used(), 1);
  }
  auto again = joiner("h8");
  JobView refused;
  for (const int64_t end = t + 6'000 * kMs; t <= end && refused.state != State::kEnded;
       t += 100 * kMs) {
    EXPECT_EQ(n0->poll(t).state, State::kRunning);
    EXPECT_EQ(n2->poll(t).state, State::kRunning);
    refused = again->poll(t);
  }
  ASSERT_EQ(refused.state, State::kEnded);
  EXPECT_NE(refused.why.find("its machine 'h8' was declared lost 2 times"), std::string::npos)
      << refused.why;
}

// A job that is finishing (a member's workers are done) is not stopped for
// a joiner.
TEST_F(RejoinTest, NoRejoinOnceAMemberIsDone) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  lose_node_1(n0.get(), n1.get(), n2.get(), t);
  n2->coordinator->report_stopped(true);
  auto s = joiner("h9");
  const int64_t end = t + 5'000 * kMs;
  for (; t <= end; t += 100 * kMs) {
    ASSERT_EQ(n0->poll(t).state, State::kRunning);
    n2->poll(t);  // its agent waits for the others, beating
    s->poll(t);
  }
  EXPECT_FALSE(raw_.check({coordinator_key("gen/1/rejoin")}));
}

// A node's own failure report never says "rejoin" (only the leader's
// cause does): one that does ends the job naming its key.
TEST_F(RejoinTest, AFailureReportOfKindRejoinEndsTheJobNamingTheKey) {
  auto n0 = node(0), n1 = node(1), n2 = node(2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 500 * kMs);
  raw_.set(coordinator_key("gen/0/failure/1"),
           R"({"kind":"rejoin","rank":-1,"node":1,"pid":0,"what":"x","injected":false,)"
           R"("detected_after_ms":0,"last_step":-1,"mean_step_ms":0})");
  raw_.add(coordinator_key("gen/0/reports"), 1);
  for (Agent* a : {n0.get(), n1.get(), n2.get()}) a->coordinator->report_stopped(false);
  const JobView v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("'brigade/coord/gen/0/failure/1' holds"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("not a failure report of node 1"), std::string::npos) << v.why;
}

// --node-id names a machine in a store key (host/<id>/losses): refused
// empty, too long, or with a '/' or a space, naming the fix.
TEST(CheckNodeId, RefusesIdsThatCannotNameAMachine) {
  EXPECT_NO_THROW(check_node_id("node-1.rack7"));
  for (const std::string& bad :
       std::vector<std::string>{"", "rack/7", "a b", std::string(129, 'x')}) {
    try {
      check_node_id(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "cannot name a machine: give --node-id (or BRIGADE_NODE_ID) 1 to 128 "
                    "characters without '/', spaces or control characters"),
                std::string::npos)
          << e.what();
    }
  }
  // A Coordinator is refused one too, before it writes anything.
  TcpStoreServer server("127.0.0.1", 0, kToken);
  TcpStore client("127.0.0.1", server.port(), kToken, 1'000);
  TcpCoordinatorStore store(client);
  CoordinatorOptions o;
  o.nnodes = 2;
  o.host = "rack/7";
  EXPECT_THROW(Coordinator(store, o, 0), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

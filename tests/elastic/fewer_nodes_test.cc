// Going on with fewer nodes (`--nnodes MIN:MAX`, elastic/coordinator.h):
// the leader's decision alone. As in standby_test.cc, every agent is a
// Coordinator over its own client of one real TcpStore, and time is passed
// in by the test. End to end, training included: tests/cli/elastic_fewer_test.cc.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/tcp_store.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/standby.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kMs = 1'000'000;
constexpr char kToken[] = "fewer-test-token";
using State = JobView::State;

struct Agent {
  Agent(uint16_t port, int nnodes, int min_nnodes, int rank, bool standby, int64_t train_dp = 0,
        int64_t train_grad_accum = 0)
      : client("127.0.0.1", port, kToken, 1'000), store(client) {
    CoordinatorOptions o;
    o.train_dp = train_dp;
    o.train_grad_accum = train_grad_accum;
    o.nnodes = nnodes;
    o.min_nnodes = min_nnodes;
    o.node_rank = rank;
    o.max_restarts = 3;
    o.standby = standby;
    coordinator = std::make_unique<Coordinator>(store, o, 0);
  }
  JobView poll(int64_t t) { return coordinator->poll(t); }
  TcpStore client;
  TcpCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

class FewerNodesTest : public ::testing::Test {
 protected:
  std::unique_ptr<Agent> node(int rank, int nnodes, int min_nnodes, int64_t train_dp = 0,
                              int64_t train_grad_accum = 0) {
    return std::make_unique<Agent>(server_.port(), nnodes, min_nnodes, rank, false, train_dp,
                                   train_grad_accum);
  }
  std::unique_ptr<Agent> standby(int nnodes, int min_nnodes) {
    return std::make_unique<Agent>(server_.port(), nnodes, min_nnodes, 0, true);
  }
  // A failure of generation 0 reported to the store as an agent would,
  // with `cause` (the report's JSON).
  void report_in_generation_0(const std::string& cause) {
    raw_.add(coordinator_key("gen/0/reports"), 1);
    raw_.set(coordinator_key("gen/0/cause"), cause);
  }
  // Generation 0 failed (rank 0 crashed) and generation 1 is open with
  // `members` (and `train_layout`, when given) as the store holds them:
  // what the agents' next poll reads, a leader's or a forger's.
  void open_generation_1(const std::string& members, const std::string& train_layout = "") {
    report_in_generation_0(R"({"kind":"crash","rank":0,"node":0,"pid":1,"what":"x",)"
                           R"("injected":false,"detected_after_ms":1,"last_step":1,)"
                           R"("mean_step_ms":1})");
    raw_.set(coordinator_key("gen/1/members"), members);
    if (!train_layout.empty()) raw_.set(coordinator_key("gen/1/train_layout"), train_layout);
    raw_.set(coordinator_key("gen/1/open"), "1");
  }
  // The nodes in `live` (all of them polled from t on) stop their workers
  // for a failure and enter the generation the leader opens; returns each
  // one's view of it.
  static std::vector<JobView> restart(const std::vector<Agent*>& live, int64_t& t) {
    for (Agent* a : live) {
      for (; a->poll(t).state != State::kFailing; t += 100 * kMs) {
        if (t > 60'000 * kMs) ADD_FAILURE() << "never failing";
        if (t > 60'000 * kMs) return {};
      }
      a->coordinator->report_stopped(false);
    }
    std::vector<JobView> views;
    live[0]->poll(t += 100 * kMs);  // the leader decides
    t += 100 * kMs;
    for (Agent* a : live) {
      views.push_back(a->poll(t));
      if (views.back().state == State::kRestart) a->coordinator->enter_next_generation();
    }
    return views;
  }
  // Polls every agent in `live` each 100 ms from t until `until`.
  static void run(const std::vector<Agent*>& live, int64_t& t, int64_t until) {
    for (; t <= until; t += 100 * kMs) {
      for (Agent* a : live) a->poll(t);
    }
  }
  TcpStoreServer server_{"127.0.0.1", 0, kToken};
  TcpStore raw_{"127.0.0.1", server_.port(), kToken, 1'000};
};

// 3 nodes, --nnodes 2:3, no standby: node 1 falls silent. The leader opens
// generation 1 with nodes 0 and 2, node 2 renumbered 1 of 2; the incident
// says the job went on with 2 nodes.
TEST_F(FewerNodesTest, ALostNodeWithNoStandbyLeavesTheJobOnTheLiveNodesRenumbered) {
  auto n0 = node(0, 3, 2), n1 = node(1, 3, 2), n2 = node(2, 3, 2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 1'000 * kMs);
  run({n0.get(), n2.get()}, t, 3'200 * kMs);  // node 1 silent for more than 2 s
  EXPECT_EQ(n0->poll(t).state, State::kFailing);
  EXPECT_EQ(n2->poll(t).state, State::kFailing);
  n0->coordinator->report_stopped(false);
  n2->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);  // decides
  for (Agent* a : {n0.get(), n2.get()}) {
    const JobView v = a->poll(t += 100 * kMs);
    ASSERT_EQ(v.state, State::kRestart);
    ASSERT_TRUE(v.cause);
    EXPECT_EQ(v.cause->kind, "node_lost");
    EXPECT_EQ(v.cause->node, 1);
    EXPECT_EQ(v.cause->nodes, 2);
    EXPECT_NE(v.cause->what.find("no standby node is free: the job goes on with 2 of its 3 nodes "
                                 "in generation 1 (node 2 -> 1)"),
              std::string::npos)
        << v.cause->what;
    a->coordinator->enter_next_generation();
    EXPECT_EQ(a->coordinator->members(), (std::vector<int>{0, 2}));
    EXPECT_EQ(a->coordinator->member_count(), 2);
  }
  EXPECT_EQ(n0->coordinator->member_index(), 0);
  EXPECT_EQ(n2->coordinator->member_index(), 1);
  EXPECT_EQ(n0->coordinator->nodes_lost_unreplaced(), (std::vector<int>{1}));
  // Node 1's agent, back, is out for good.
  const JobView back = n1->poll(t);
  EXPECT_EQ(back.state, State::kEnded);
  EXPECT_TRUE(back.lost_coordinator);
  // Generation 1 succeeds on the two nodes alone: node 1 is not waited for.
  n0->coordinator->report_stopped(true);
  n2->coordinator->report_stopped(true);
  EXPECT_EQ(n0->poll(t += 100 * kMs).state, State::kSucceeded);
  EXPECT_EQ(n2->poll(t).state, State::kSucceeded);
}

// A standby free is used first: the world size stays, nobody is left out.
TEST_F(FewerNodesTest, AFreeStandbyIsUsedBeforeGoingOnWithFewerNodes) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1), s = standby(2, 1);
  int64_t t = 0;
  run({n0.get(), n1.get(), s.get()}, t, 1'000 * kMs);
  run({n0.get(), s.get()}, t, 3'200 * kMs);
  EXPECT_EQ(n0->poll(t).state, State::kFailing);
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  const JobView v = n0->poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart);
  EXPECT_EQ(v.cause->nodes, 0);
  EXPECT_NE(v.cause->what.find("standby 0 takes its place as node 1"), std::string::npos)
      << v.cause->what;
  n0->coordinator->enter_next_generation();
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 1}));
  ASSERT_EQ(s->poll(t).state, State::kRestart);
  EXPECT_EQ(s->coordinator->node_rank(), 1);
  EXPECT_EQ(s->coordinator->member_index(), 1);
  EXPECT_EQ(s->coordinator->member_count(), 2);
}

// Below MIN the job ends naming the nodes: 3 nodes, --nnodes 2:3, nodes 1
// and 2 both silent. And without MIN:MAX (min = max) one lost node ends it.
TEST_F(FewerNodesTest, BelowTheFewestAllowedTheJobEndsNamingTheNodes) {
  auto n0 = node(0, 3, 2), n1 = node(1, 3, 2), n2 = node(2, 3, 2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 1'000 * kMs);
  JobView v;
  for (; t <= 4'000 * kMs && v.state != State::kEnded; t += 100 * kMs) v = n0->poll(t);
  ASSERT_EQ(v.state, State::kEnded) << v.why;
  EXPECT_EQ(v.lost_nodes, (std::vector<int>{2, 1}));
  EXPECT_NE(v.why.find("going on without nodes 2, 1 would leave 1 of the job's 3 nodes, fewer "
                       "than the 2 that --nnodes 2:3 allows, so the job ends"),
            std::string::npos)
      << v.why;
}

TEST_F(FewerNodesTest, WithoutMinMaxALostNodeWithNoStandbyEndsTheJob) {
  auto n0 = node(0, 2, 0), n1 = node(1, 2, 0);
  int64_t t = 0;
  run({n0.get(), n1.get()}, t, 1'000 * kMs);
  JobView v;
  for (; t <= 4'000 * kMs && v.state != State::kEnded; t += 100 * kMs) v = n0->poll(t);
  ASSERT_EQ(v.state, State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_NE(v.why.find("launch every node with --nnodes MIN:MAX"), std::string::npos) << v.why;
}

// A members list no agent would write is refused, never acted on.
TEST_F(FewerNodesTest, AMalformedMembersListEndsTheJobNamingTheKey) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1);
  open_generation_1("1 0");
  const JobView v = n1->poll(0);
  EXPECT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("brigade/coord/gen/1/members"), std::string::npos) << v.why;
}

// Over TCP node 0 holds the store, so a generation without it is one no
// agent wrote (only an electing store, etcd, may leave node 0 out).
TEST_F(FewerNodesTest, OverTcpAMembersListWithoutNode0EndsTheJobNamingTheKey) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1);
  open_generation_1("1");
  const JobView v = n1->poll(0);
  EXPECT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("brigade/coord/gen/1/members"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("node 0 first"), std::string::npos) << v.why;
}

// Over TCP node 0 is never declared lost: an end naming it among the lost
// nodes is refused.
TEST_F(FewerNodesTest, OverTcpAnEndNamingNode0LostIsRefusedNamingTheKey) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1);
  raw_.set(coordinator_key("end"),
           R"({"kind":"node_lost","what":"x","node":1,"lost_nodes":[1,0]})");
  const JobView v = n1->poll(0);
  EXPECT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("brigade/coord/end"), std::string::npos) << v.why;
}

// 3 nodes, --nnodes 2:3, one standby: nodes 1 and 2 fall silent together.
// The standby takes node 1's place and node 2 is left out, in one decision:
// the job goes on with 2 nodes (needing every lost node replaced, or every
// one leavable, would end it).
TEST_F(FewerNodesTest, OneStandbyForTwoLostNodesTakesOneAndTheOtherIsLeftOut) {
  auto n0 = node(0, 3, 2), n1 = node(1, 3, 2), n2 = node(2, 3, 2), s = standby(3, 2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get(), s.get()}, t, 1'000 * kMs);
  run({n0.get(), s.get()}, t, 3'200 * kMs);
  const JobView v = n0->poll(t);
  ASSERT_EQ(v.state, State::kFailing) << v.why;
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  const JobView opened = n0->poll(t += 100 * kMs);
  ASSERT_EQ(opened.state, State::kRestart) << opened.why;
  EXPECT_EQ(opened.cause->nodes, 2);
  // Opened, not yet entered (a Ctrl-C here ends node 0 in generation 0):
  // node 2 is out already, node 1 (the standby's now) is not.
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(n0->coordinator->nodes_lost_unreplaced(), (std::vector<int>{2}));
  n0->coordinator->enter_next_generation();
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 1}));
  ASSERT_EQ(s->poll(t).state, State::kRestart);
  EXPECT_EQ(s->coordinator->node_rank(), 1);
  EXPECT_EQ(s->coordinator->member_index(), 1);
  EXPECT_EQ(s->coordinator->member_count(), 2);
}

// The layout a `brigade train` runs with on fewer nodes is the leader's
// (node 0's dp 3 x grad_accum 2 on 3 nodes -> dp 2 x grad_accum 3 on 2),
// written for every agent: node 2, launched knowing none (or another),
// takes it; then a standby given node 2's place on the 2 nodes left runs
// as node 1 of 2 with the same layout.
TEST_F(FewerNodesTest, EveryAgentTakesTheLeadersScaledLayoutAStandbyIncluded) {
  auto n0 = node(0, 3, 2, 3, 2), n1 = node(1, 3, 2), n2 = node(2, 3, 2);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 1'000 * kMs);
  run({n0.get(), n2.get()}, t, 3'200 * kMs);
  const std::vector<JobView> views = restart({n0.get(), n2.get()}, t);
  ASSERT_EQ(views.size(), 2u);
  for (const auto* a : {n0.get(), n2.get()}) {
    ASSERT_EQ(a->coordinator->generation(), 1);
    const auto& layout = a->coordinator->train_layout();
    ASSERT_TRUE(layout);
    EXPECT_EQ(layout->dp, 2);
    EXPECT_EQ(layout->grad_accum, 3);
  }
  EXPECT_EQ(n2->coordinator->member_index(), 1);
  // Node 2 (node 1 of 2) falls silent as a standby starts: the standby
  // takes its place among the 2 nodes, with the leader's layout. (Had it
  // beaten for 2 s before, it would have joined as node 1 instead:
  // rejoin_test.cc.)
  auto s = standby(3, 2);
  run({n0.get(), s.get()}, t, t + 2'200 * kMs);
  ASSERT_EQ(n0->poll(t).state, State::kFailing);
  n0->coordinator->report_stopped(false);
  n0->poll(t += 100 * kMs);
  ASSERT_EQ(n0->poll(t += 100 * kMs).state, State::kRestart);
  n0->coordinator->enter_next_generation();
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
  ASSERT_EQ(s->poll(t).state, State::kRestart);
  EXPECT_EQ(s->coordinator->node_rank(), 2);
  EXPECT_EQ(s->coordinator->member_index(), 1);
  EXPECT_EQ(s->coordinator->member_count(), 2);
  const auto& layout = s->coordinator->train_layout();
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->dp, 2);
  EXPECT_EQ(layout->grad_accum, 3);
}

// --nnodes 1:3: node 1 lost, then node 2: node 0 ends alone, members [0].
TEST_F(FewerNodesTest, TwoLossesInTurnLeaveNodeZeroAlone) {
  auto n0 = node(0, 3, 1), n1 = node(1, 3, 1), n2 = node(2, 3, 1);
  int64_t t = 0;
  run({n0.get(), n1.get(), n2.get()}, t, 1'000 * kMs);
  run({n0.get(), n2.get()}, t, 3'200 * kMs);
  ASSERT_EQ(restart({n0.get(), n2.get()}, t).size(), 2u);
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0, 2}));
  run({n0.get(), n2.get()}, t, t + 1'000 * kMs);
  run({n0.get()}, t, t + 2'200 * kMs);
  const std::vector<JobView> views = restart({n0.get()}, t);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].cause->node, 2);
  EXPECT_EQ(views[0].cause->nodes, 1);
  EXPECT_EQ(n0->coordinator->members(), (std::vector<int>{0}));
  EXPECT_EQ(n0->coordinator->member_count(), 1);
}

// A train layout no leader would write is refused, never passed on.
TEST_F(FewerNodesTest, AMalformedTrainLayoutEndsTheJobNamingTheKey) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1);
  open_generation_1("0", "0 2");
  const JobView v = n1->poll(0);
  EXPECT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("brigade/coord/gen/1/train_layout"), std::string::npos) << v.why;
}

// A failure report saying the job went on with more nodes than it has is
// refused (2 nodes, "nodes": 3).
TEST_F(FewerNodesTest, AReportWithMoreNodesThanTheJobsIsRefused) {
  auto n0 = node(0, 2, 1), n1 = node(1, 2, 1);
  report_in_generation_0(R"({"kind":"node_lost","rank":-1,"node":1,"pid":0,"what":"x",)"
                         R"("injected":false,"detected_after_ms":1,"last_step":1,)"
                         R"("mean_step_ms":1,"nodes":3})");
  raw_.set(coordinator_key("gen/1/open"), "1");
  const JobView v = n0->poll(0);
  EXPECT_EQ(v.state, State::kEnded);
  EXPECT_NE(v.why.find("brigade/coord/gen/0/cause"), std::string::npos) << v.why;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

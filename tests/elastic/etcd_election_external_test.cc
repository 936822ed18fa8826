// Leader election over etcd (elastic/etcd_election.cc) against a real etcd
// the test starts on loopback with authentication on
// (tests/testing/etcd_server.h); skipped, saying so, without etcd.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/etcd_store.h"
#include "testing/etcd_server.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

using testing::EtcdServer;
constexpr char kToken[] = "etcd-election-test-token";
constexpr char kRun[] = "00112233445566aa";

class EtcdElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
    etcd_ = std::make_unique<EtcdServer>();
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->add_job(etcd_user(kToken), kToken, etcd_prefix(kToken)));
  }
  // An agent's client in run kRun, with its own lease. Calls get 5 s: these
  // tests do not measure the timeout.
  std::unique_ptr<EtcdCoordinatorStore> agent(int64_t ttl_s = 30) {
    auto s = std::make_unique<EtcdCoordinatorStore>(std::vector<std::string>{etcd_->url()}, kToken,
                                                    5'000);
    s->use_run(kRun);
    s->grant_lease(ttl_s);
    return s;
  }
  std::unique_ptr<EtcdServer> etcd_;
};

TEST_F(EtcdElectionTest, OneOfTwoContendersLeadsAndTheOtherTakesOverWhenItsLeaseIsRevoked) {
  auto a = agent();
  auto b = agent();
  const auto first = a->campaign("node 0");
  EXPECT_TRUE(first.ours);
  EXPECT_EQ(first.holder, "node 0");
  // The key exists: b does not take it, and learns who leads.
  const auto second = b->campaign("node 1");
  EXPECT_FALSE(second.ours);
  EXPECT_EQ(second.holder, "node 0");
  EXPECT_EQ(second.revision, first.revision);
  // The leader leaves (its agent exits): its key goes with its lease.
  a->revoke_lease();
  const auto none = b->leader();
  EXPECT_FALSE(none.has_value());
  const auto taken = b->campaign("node 1");
  EXPECT_TRUE(taken.ours);
  EXPECT_EQ(taken.holder, "node 1");
  EXPECT_NE(taken.revision, first.revision);
  const auto seen = agent()->leader();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->holder, "node 1");
  EXPECT_FALSE(seen->ours);
}

TEST_F(EtcdElectionTest, ALeaderWhoseLeaseExpiredIsReplacedAndItsWritesAreRefused) {
  // Its agent stops renewing (dead, hung or cut off): etcd's minimum TTL.
  auto old_leader = agent(/*ttl_s=*/1);
  auto other = agent();
  ASSERT_TRUE(old_leader->campaign("node 0").ours);
  old_leader->set("brigade/coord/gen/1/open", "1");  // fenced, and still the leader: applied
  EXPECT_EQ(other->try_get("brigade/coord/gen/1/open"), "1");
  EXPECT_EQ(old_leader->add("brigade/coord/gen/0/reports", 1), 1);
  // etcd lets a lease run out a few seconds late at most; 60 s on a loaded machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool took_over = false;
  while (!took_over && std::chrono::steady_clock::now() < deadline) {
    took_over = other->campaign("node 1").ours;
    if (!took_over) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(took_over) << "the expired leader's key was never deleted";
  EXPECT_FALSE(old_leader->renew_lease());
  // The new leader decides; the old one, still running, cannot undo it.
  other->set("brigade/coord/gen/1/open", "2");
  EXPECT_THROW(old_leader->set("brigade/coord/gen/1/open", "1"), NotLeader);
  EXPECT_THROW(old_leader->add("brigade/coord/gen/0/reports", 1), NotLeader);
  EXPECT_EQ(other->try_get("brigade/coord/gen/1/open"), "2");
  EXPECT_EQ(other->add("brigade/coord/gen/0/reports", 0), 1);
  // A campaign does not bring it back while the other leads.
  EXPECT_FALSE(old_leader->campaign("node 0").ours);
}

TEST_F(EtcdElectionTest, AFollowersWritesAreNotFencedAndALeaderStaysWhileItRenews) {
  auto leader = agent(/*ttl_s=*/1);
  auto follower = agent();
  ASSERT_TRUE(leader->campaign("node 0").ours);
  EXPECT_FALSE(follower->campaign("node 1").ours);
  // Renewed well within its TTL for longer than the TTL: it still leads.
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(leader->renew_lease());
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const auto still = follower->leader();
  ASSERT_TRUE(still.has_value());
  EXPECT_EQ(still->holder, "node 0");
  follower->set("brigade/coord/agent/1/host", "h1");
  EXPECT_EQ(follower->add("brigade/coord/agent/1/beat", 1), 1);
  leader->set("brigade/coord/gen/1/open", "1");
  EXPECT_EQ(follower->try_get("brigade/coord/gen/1/open"), "1");
}

TEST_F(EtcdElectionTest, CampaigningWithoutALeaseIsRefused) {
  auto s =
      std::make_unique<EtcdCoordinatorStore>(std::vector<std::string>{etcd_->url()}, kToken, 5'000);
  s->use_run(kRun);
  EXPECT_THROW(s->campaign("node 0"), Error);
}

// The coordinator over etcd when the leader's node is lost: another node's
// agent takes the leader key once the old leader's lease ran out, and
// handles the old leader's node as any lost node. Time is passed in, as in
// coordinator_test.cc; the lease runs out in real time, so the loops below
// sleep as long as they advance.
constexpr int64_t kMs = 1'000'000;
using State = JobView::State;

struct EtcdAgent {
  EtcdAgent(const std::string& url, int nnodes, int min_nnodes, int rank, bool standby = false)
      : store(std::vector<std::string>{url}, kToken, 1'000) {
    store.use_run(kRun);
    CoordinatorOptions o;
    o.nnodes = nnodes;
    o.min_nnodes = min_nnodes;
    o.node_rank = rank;
    o.standby = standby;
    o.max_restarts = 3;
    coordinator = std::make_unique<Coordinator>(store, o, 0);
  }
  JobView poll(int64_t t) { return coordinator->poll(t); }
  EtcdCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

// Polls `live` every 100 ms (of t, and of real time) until `done` or 60 s
// of real time on a loaded machine.
template <typename Done>
bool poll_until(const std::vector<EtcdAgent*>& live, int64_t& t, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    for (EtcdAgent* a : live) a->poll(t);
    if (done()) return true;
    t += 100 * kMs;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST_F(EtcdElectionTest, WhenTheLeadersNodeIsLostAnotherLeadsAndTheJobGoesOnWithoutIt) {
  // --nnodes 1:2: the job may go on with node 1 alone.
  EtcdAgent n0(etcd_->url(), 2, 1, 0), n1(etcd_->url(), 2, 1, 1);
  EXPECT_TRUE(n0.coordinator->leader());
  EXPECT_FALSE(n1.coordinator->leader());
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    ASSERT_EQ(n0.poll(t).state, State::kRunning);
    ASSERT_EQ(n1.poll(t).state, State::kRunning);
  }
  // Node 0's agent dies: it neither beats nor renews its lease.
  const int64_t silent_from = t;
  ASSERT_TRUE(poll_until({&n1}, t, [&] { return n1.coordinator->leader(); }))
      << "node 1 never took over";
  const int64_t took_over = t;
  EXPECT_EQ(n1.coordinator->leader_node(), 1);
  // No standby to see beat first: node 0 is declared lost at the next poll.
  n1.poll(t += 100 * kMs);
  EXPECT_NE(n1.coordinator->declared_lost(0), nullptr);
  // The new leader declared node 0 lost: node 1 stops its workers.
  ASSERT_TRUE(poll_until({&n1}, t, [&] { return n1.poll(t).state == State::kFailing; }));
  n1.coordinator->report_stopped(false);
  n1.poll(t += 100 * kMs);  // decides
  const JobView v = n1.poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart) << v.why;
  ASSERT_TRUE(v.cause);
  EXPECT_EQ(v.cause->kind, "node_lost");
  EXPECT_EQ(v.cause->node, 0);
  EXPECT_EQ(v.cause->nodes, 1);
  EXPECT_NE(v.cause->what.find("node 0 is lost"), std::string::npos) << v.cause->what;
  // Detected when node 1 took over (the silence past 2 s, the lease gone),
  // not after it settled (the cluster test bounds it by 3 s in real time:
  // here the lease runs out in real time and t lags it).
  const Incident* lost = n1.coordinator->declared_lost(0);
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(lost->detected_ns, took_over);
  EXPECT_LE(lost->fault_ns, silent_from);
  EXPECT_GE(lost->detected_ns - lost->fault_ns, 2'000 * kMs);
  n1.coordinator->enter_next_generation();
  EXPECT_EQ(n1.coordinator->members(), (std::vector<int>{1}));
  EXPECT_EQ(n1.coordinator->member_index(), 0);
  EXPECT_EQ(n1.coordinator->nodes_lost_unreplaced(), (std::vector<int>{0}));
  // Node 0's agent, back, is out: its lease is gone and the job went on.
  const JobView back = n0.poll(t);
  EXPECT_EQ(back.state, State::kEnded);
  EXPECT_TRUE(back.lost_coordinator);
  EXPECT_NE(back.why.find("another node leads now"), std::string::npos) << back.why;
  // and leads no more: its agent writes nothing into the run directory.
  EXPECT_FALSE(n0.coordinator->leader());
  EXPECT_EQ(n0.poll(t).state, State::kEnded);
  EXPECT_FALSE(n0.coordinator->leader());
  // Generation 1 succeeds on node 1 alone.
  n1.coordinator->report_stopped(true);
  EXPECT_EQ(n1.poll(t += 100 * kMs).state, State::kSucceeded);
}

// A new leader that lost the store between its takeover and its verdict
// counts the old leader's silence afresh once it has the store again: the
// loss is stamped when that silence ran out, never before its fault.
TEST_F(EtcdElectionTest, ANewLeaderThatRegainsTheStoreStampsTheOldLeadersLossAfresh) {
  EtcdAgent n0(etcd_->url(), 3, 1, 0), n1(etcd_->url(), 3, 1, 1), n2(etcd_->url(), 3, 1, 2);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    for (EtcdAgent* a : {&n0, &n1, &n2}) ASSERT_EQ(a->poll(t).state, State::kRunning);
  }
  // Node 0's agent dies; one of the others takes over.
  ASSERT_TRUE(poll_until({&n1, &n2}, t, [&] {
    return n1.coordinator->leader() || n2.coordinator->leader();
  })) << "nobody took over";
  EtcdAgent& leader = n1.coordinator->leader() ? n1 : n2;
  EtcdAgent& other = n1.coordinator->leader() ? n2 : n1;
  // Its store call failed at once and it got through again: every silence
  // is counted from here.
  const int64_t regained = t;
  ASSERT_FALSE(leader.coordinator->regain_store(std::nullopt, regained));
  ASSERT_TRUE(poll_until({&leader, &other}, t, [&] {
    return leader.coordinator->declared_lost(0);
  })) << "node 0 never declared lost";
  const Incident* lost = leader.coordinator->declared_lost(0);
  EXPECT_GE(lost->fault_ns, regained);
  EXPECT_GE(lost->detected_ns - lost->fault_ns, 2'000 * kMs);
}

// A leader that takes over keeps the losses the old one declared in this
// generation, but they carry no stamps of its own (it never watched those
// nodes go silent; it rebuilds them at its takeover): declared_lost gives
// none for them, so the agent's incident does not take its stop and
// detection times from a rebuilt record, while the losses it declares
// itself carry its own.
TEST_F(EtcdElectionTest, ATakenOverLeaderDeclaresOnlyTheLossesItSawItself) {
  // --nnodes 1:3: the job may go on with node 1 alone.
  EtcdAgent n0(etcd_->url(), 3, 1, 0), n1(etcd_->url(), 3, 1, 1), n2(etcd_->url(), 3, 1, 2);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    for (EtcdAgent* a : {&n0, &n1, &n2}) ASSERT_EQ(a->poll(t).state, State::kRunning);
  }
  // Node 2's agent dies; the leader, node 0, declares it lost.
  const int64_t silent_from = t;
  ASSERT_TRUE(poll_until({&n0, &n1}, t, [&] { return n0.coordinator->declared_lost(2); }))
      << "node 0 never declared node 2 lost";
  const Incident* by_n0 = n0.coordinator->declared_lost(2);
  EXPECT_LE(by_n0->fault_ns, silent_from);
  EXPECT_GE(by_n0->detected_ns - by_n0->fault_ns, 1'000 * kMs) << "a silence of its own seeing";
  // Then node 0's agent dies too, before the next generation opens.
  ASSERT_TRUE(poll_until({&n1}, t, [&] { return n1.coordinator->leader(); }))
      << "node 1 never took over";
  EXPECT_EQ(n1.coordinator->declared_lost(2), nullptr)
      << "node 2's loss was node 0's verdict: the new leader has no stamps of it";
  ASSERT_TRUE(poll_until({&n1}, t, [&] { return n1.coordinator->declared_lost(0); }))
      << "node 1 never declared node 0 lost";
  const Incident* by_n1 = n1.coordinator->declared_lost(0);
  EXPECT_GT(by_n1->detected_ns, by_n1->fault_ns);
  EXPECT_EQ(n1.coordinator->declared_lost(2), nullptr);
  // Both stay lost: the next generation runs on node 1 alone.
  ASSERT_TRUE(poll_until({&n1}, t, [&] { return n1.poll(t).state == State::kFailing; }));
  n1.coordinator->report_stopped(false);
  n1.poll(t += 100 * kMs);
  const JobView v = n1.poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart) << v.why;
  n1.coordinator->enter_next_generation();
  EXPECT_EQ(n1.coordinator->members(), (std::vector<int>{1}));
}

TEST_F(EtcdElectionTest, WithoutAStandbyOrFewerNodesTheLeadersLossEndsTheJobNamingNodeZero) {
  EtcdAgent n0(etcd_->url(), 2, 0, 0), n1(etcd_->url(), 2, 0, 1);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    n0.poll(t);
    n1.poll(t);
  }
  JobView v;
  ASSERT_TRUE(poll_until({&n1}, t, [&] {
    v = n1.poll(t);
    return v.state == State::kEnded;
  }));
  EXPECT_EQ(v.lost_node, 0) << v.why;
  EXPECT_FALSE(v.lost_coordinator) << v.why;  // the new leader ended it
  EXPECT_NE(v.why.find("node 0 is lost"), std::string::npos) << v.why;
}

TEST_F(EtcdElectionTest, AStandbyTakesTheLostLeadersNodeUnderTheNewLeader) {
  EtcdAgent n0(etcd_->url(), 2, 0, 0), n1(etcd_->url(), 2, 0, 1);
  EtcdAgent standby(etcd_->url(), 2, 0, 0, /*standby=*/true);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    for (EtcdAgent* a : {&n0, &n1, &standby}) ASSERT_EQ(a->poll(t).state, State::kRunning);
  }
  ASSERT_TRUE(poll_until({&n1, &standby}, t, [&] { return n1.poll(t).state == State::kFailing; }));
  EXPECT_TRUE(n1.coordinator->leader());
  n1.coordinator->report_stopped(false);
  JobView taken;
  ASSERT_TRUE(poll_until({&n1}, t, [&] {
    taken = standby.poll(t);
    return taken.state != State::kRunning;
  }));
  ASSERT_EQ(taken.state, State::kRestart) << taken.why;
  EXPECT_EQ(standby.coordinator->node_rank(), 0);
  EXPECT_EQ(standby.coordinator->leader_node(), 1);
  const JobView v = n1.poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart) << v.why;
  ASSERT_TRUE(v.cause);
  EXPECT_EQ(v.cause->node, 0);
  EXPECT_NE(v.cause->what.find("standby 0 takes its place as node 0"), std::string::npos)
      << v.cause->what;
  n1.coordinator->enter_next_generation();
  EXPECT_EQ(n1.coordinator->members(), (std::vector<int>{0, 1}));
  // The standby, as node 0, beats; the leader does not take it for lost.
  for (int i = 0; i < 30; ++i) {
    t += 100 * kMs;
    ASSERT_EQ(standby.poll(t).state, State::kRunning);
    ASSERT_EQ(n1.poll(t).state, State::kRunning);
  }
  standby.coordinator->report_stopped(true);
  n1.coordinator->report_stopped(true);
  EXPECT_EQ(n1.poll(t += 100 * kMs).state, State::kSucceeded);
  EXPECT_EQ(standby.poll(t).state, State::kSucceeded);
}

// 3 nodes, 2 standbys: standby 0 takes node 2; then node 0 (the leader) is
// lost. Whoever of node 1 and standby 0 (as node 2) wins, the other follows
// the winner's beat (a standby's beats under its own key) and the job goes
// on; standby 1, not standby 0 (busy as node 2), takes node 0.
TEST_F(EtcdElectionTest, AfterAStandbyTookANodeTheNewLeaderGivesTheLostLeadersNodeToAFreeOne) {
  EtcdAgent n0(etcd_->url(), 3, 0, 0), n1(etcd_->url(), 3, 0, 1), n2(etcd_->url(), 3, 0, 2);
  EtcdAgent s0(etcd_->url(), 3, 0, 0, /*standby=*/true);
  EtcdAgent s1(etcd_->url(), 3, 0, 0, /*standby=*/true);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    for (EtcdAgent* a : {&n0, &n1, &n2, &s0, &s1}) ASSERT_EQ(a->poll(t).state, State::kRunning);
  }
  // Node 2 is lost: standby 0 takes it.
  ASSERT_TRUE(poll_until({&n1, &s0, &s1}, t, [&] { return n0.poll(t).state == State::kFailing; }));
  n0.coordinator->report_stopped(false);
  n1.coordinator->report_stopped(false);
  JobView taken;
  ASSERT_TRUE(poll_until({&n0, &n1, &s1}, t, [&] {
    taken = s0.poll(t);
    return taken.state != State::kRunning;
  }));
  ASSERT_EQ(taken.state, State::kRestart) << taken.why;
  ASSERT_EQ(s0.coordinator->node_rank(), 2);
  for (EtcdAgent* a : {&n0, &n1}) {
    ASSERT_EQ(a->poll(t += 100 * kMs).state, State::kRestart);
    a->coordinator->enter_next_generation();
  }
  for (int i = 0; i < 10; ++i) {
    t += 100 * kMs;
    for (EtcdAgent* a : {&n0, &n1, &s0, &s1}) ASSERT_EQ(a->poll(t).state, State::kRunning);
  }
  // Node 0, the leader, is lost: one of node 1 and node 2 (standby 0) leads.
  bool ended = false;
  std::string why;
  const auto poll_live = [&] {
    for (EtcdAgent* a : {&n1, &s0}) {
      const JobView v = a->poll(t);
      if (v.state == State::kEnded) ended = true, why = v.why;
    }
  };
  ASSERT_TRUE(poll_until({&s1}, t, [&] {
    poll_live();
    return ended || n1.poll(t).state == State::kFailing;
  }));
  ASSERT_FALSE(ended) << why;
  EtcdAgent& leader = n1.coordinator->leader() ? n1 : s0;
  EtcdAgent& other = n1.coordinator->leader() ? s0 : n1;
  ASSERT_TRUE(leader.coordinator->leader());
  EXPECT_EQ(other.coordinator->leader_node(), leader.coordinator->node_rank());
  n1.coordinator->report_stopped(false);
  s0.coordinator->report_stopped(false);
  JobView given;
  ASSERT_TRUE(poll_until({&n1, &s0}, t, [&] {
    given = s1.poll(t);
    return given.state != State::kRunning;
  }));
  ASSERT_EQ(given.state, State::kRestart) << given.why;
  EXPECT_EQ(s1.coordinator->node_rank(), 0);
  EXPECT_EQ(s0.coordinator->node_rank(), 2);
  const JobView v = leader.poll(t += 100 * kMs);
  ASSERT_EQ(v.state, State::kRestart) << v.why;
  ASSERT_TRUE(v.cause);
  EXPECT_NE(v.cause->what.find("standby 1 takes its place as node 0"), std::string::npos)
      << v.cause->what;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

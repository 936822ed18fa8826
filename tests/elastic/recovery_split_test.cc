// The parts of issue 14's accounting and chaos mode, each alone: the chaos
// spec and its seeded schedule, the recovery time split of an incident, the
// summary's training window and lost time, and the heartbeat stamps the
// split is made of. The agent as a whole runs in tests/cli/elastic_test.cc
// and tests/cli/elastic_chaos_test.cc.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incidents.h"
#include "brigade/elastic/worker_group.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kMs = 1'000'000;

std::string error_of(const std::string& spec) {
  try {
    parse_faults(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Chaos, SpecParsesWithDefaultsAndStaysOutOfTheWorkersFaults) {
  const auto chaos = parse_chaos("kill:rank=1:step=5,chaos:mtbf=2.5:seed=7");
  ASSERT_TRUE(chaos);
  EXPECT_DOUBLE_EQ(chaos->mtbf_s, 2.5);
  EXPECT_EQ(chaos->seed, 7u);
  EXPECT_TRUE(chaos->kill);
  EXPECT_TRUE(chaos->stop);
  const auto faults = parse_faults("kill:rank=1:step=5,chaos:mtbf=2.5:seed=7");
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].kind, InjectedFault::Kind::kKill);
  EXPECT_FALSE(parse_chaos("kill:rank=1:step=5"));
  EXPECT_FALSE(parse_chaos(""));
  const auto stops = parse_chaos("chaos:kinds=stop:mtbf=1");
  ASSERT_TRUE(stops);
  EXPECT_FALSE(stops->kill);
  EXPECT_TRUE(stops->stop);
  const auto both = parse_chaos("chaos:mtbf=1:kinds=stop+kill");
  ASSERT_TRUE(both);
  EXPECT_TRUE(both->kill && both->stop);
}

TEST(Chaos, MalformedSpecsAreNamed) {
  EXPECT_NE(error_of("chaos:seed=1").find("needs mtbf=SECONDS"), std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=0").find("at least 0.1, got '0'"), std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=x").find("got 'x'"), std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=1:kinds=kill+flood").find("got 'flood'"), std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=1:rank=2").find("unknown or repeated key 'rank'"),
            std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=1:mtbf=2").find("unknown or repeated key 'mtbf'"),
            std::string::npos);
  EXPECT_NE(error_of("chaos:mtbf=1,chaos:mtbf=2").find("more than one chaos part"),
            std::string::npos);
  // ',' separates faults, so "kinds=kill,stop" leaves a stop without a step.
  EXPECT_NE(error_of("chaos:mtbf=1:kinds=kill,stop").find("needs rank= and step="),
            std::string::npos);
}

TEST(Chaos, TheScheduleIsSeededExponentialAndKeepsToItsKinds) {
  ChaosSpec spec;
  spec.mtbf_s = 2;
  spec.seed = 11;
  ChaosSchedule a(spec, 0, 1), b(spec, 0, 1), other_node(spec, 1, 1);
  spec.seed = 12;
  ChaosSchedule other_seed(spec, 0, 1);
  spec.seed = 11;
  int same_node = 0, same_seed = 0;
  for (int i = 0; i < 50; ++i) {
    const auto x = a.next(), y = b.next();
    EXPECT_EQ(x.after_ns, y.after_ns);
    EXPECT_EQ(x.kill(), y.kill());
    EXPECT_EQ(x.victim, y.victim);
    same_node += other_node.next().after_ns == x.after_ns;
    same_seed += other_seed.next().after_ns == x.after_ns;
  }
  EXPECT_EQ(same_node, 0);
  EXPECT_EQ(same_seed, 0);
  // Exponential with the spec's mean (times nnodes per node): mean and
  // standard deviation both the mean, within 3% over 40000 draws (the
  // standard error is 0.5%).
  ChaosSchedule many(spec, 0, 3);
  const int n = 40'000;
  double sum = 0, sum_sq = 0;
  int kills = 0;
  for (int i = 0; i < n; ++i) {
    const auto f = many.next();
    const double s = f.after_ns * 1e-9;
    sum += s;
    sum_sq += s * s;
    kills += f.kill();
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 6.0, 0.18);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 6.0, 0.18);
  EXPECT_NEAR(kills, n / 2, n / 50);
  spec.stop = false;
  ChaosSchedule kill_only(spec, 0, 1);
  spec.stop = true;
  spec.kill = false;
  ChaosSchedule stop_only(spec, 0, 1);
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(kill_only.next().kill());
    EXPECT_FALSE(stop_only.next().kill());
  }
}

TEST(Chaos, WholeNodeKindsAreParsed) {
  const auto all = parse_chaos("chaos:mtbf=60:kinds=kill+stop+partition+kill-agent:seed=3");
  ASSERT_TRUE(all);
  EXPECT_TRUE(all->kill && all->stop && all->partition && all->kill_agent);
  const auto defaults = parse_chaos("chaos:mtbf=60");
  ASSERT_TRUE(defaults);
  EXPECT_FALSE(defaults->partition || defaults->kill_agent);
  // launch --inject takes a chaos part beside the node faults.
  EXPECT_TRUE(parse_node_faults("chaos:mtbf=60:kinds=partition+kill-agent").empty());
}

// Every kind is drawn, about evenly, on a node other than 0; node 0 (whose
// launcher hosts the store) never draws a whole-node fault, at the same
// rate; a standby that took a node's place (another incarnation) draws
// another stream, not the lost node's faults again.
TEST(Chaos, WholeNodeKindsAreDrawnOffNodeZeroOnly) {
  ChaosSpec spec;
  spec.mtbf_s = 60;
  spec.seed = 4;
  spec.partition = spec.kill_agent = true;
  ChaosSchedule node0(spec, 0, 3), node1(spec, 1, 3), node1_again(spec, 1, 3, 5);
  const int n = 8'000;
  std::map<ChaosSchedule::Kind, int> on0, on1;
  double sum0 = 0;
  int same = 0;
  for (int i = 0; i < n; ++i) {
    const auto f0 = node0.next(), f1 = node1.next(), g1 = node1_again.next();
    ++on0[f0.kind];
    ++on1[f1.kind];
    EXPECT_EQ(f1.kill(), f1.kind == ChaosSchedule::Kind::kKill);
    EXPECT_EQ(f1.whole_node(), f1.kind == ChaosSchedule::Kind::kPartition ||
                                   f1.kind == ChaosSchedule::Kind::kKillAgent);
    sum0 += f0.after_ns * 1e-9;
    same += f1.after_ns == g1.after_ns;
  }
  EXPECT_EQ(on0[ChaosSchedule::Kind::kPartition] + on0[ChaosSchedule::Kind::kKillAgent], 0);
  EXPECT_NEAR(on0[ChaosSchedule::Kind::kKill], n / 2, n / 25);
  EXPECT_NEAR(sum0 / n, 180.0, 180.0 * 0.05);
  for (const auto kind : {ChaosSchedule::Kind::kKill, ChaosSchedule::Kind::kStop,
                          ChaosSchedule::Kind::kPartition, ChaosSchedule::Kind::kKillAgent}) {
    EXPECT_NEAR(on1[kind], n / 4, n / 25) << static_cast<int>(kind);
  }
  EXPECT_EQ(same, 0);
  // Whole-node kinds alone: node 0 has nothing to draw and never falls due.
  spec.kill = spec.stop = false;
  ChaosSchedule idle(spec, 0, 3);
  idle.start(0);
  int dropped = 0;
  // A year in: a node that drew faults would have had thousands.
  EXPECT_FALSE(idle.take_due(int64_t{365} * 24 * 3600 * 1'000'000'000, &dropped));
  EXPECT_EQ(dropped, 0);
}

// Faults that fell due while no worker ran (between generations) strike
// the next generation once, not all in its first tick.
TEST(Chaos, OfTheFaultsOverdueTogetherOnlyTheFirstIsTakenTheOthersCounted) {
  ChaosSpec spec;
  spec.mtbf_s = 1.0;
  spec.seed = 11;
  ChaosSchedule reference(spec, 0, 1);
  std::vector<ChaosSchedule::Fault> drawn;
  std::vector<int64_t> due_at;
  int64_t at = 5'000 * kMs;
  for (int i = 0; i < 6; ++i) {
    drawn.push_back(reference.next());
    at += drawn.back().after_ns;
    due_at.push_back(at);
  }
  ChaosSchedule schedule(spec, 0, 1);
  schedule.start(5'000 * kMs);
  int dropped = 0;
  EXPECT_EQ(schedule.due_ns(), due_at[0]);
  EXPECT_FALSE(schedule.take_due(due_at[0] - 1, &dropped));
  // On time: the first, nothing dropped.
  std::optional<ChaosSchedule::Fault> f = schedule.take_due(due_at[0], &dropped);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->victim, drawn[0].victim);
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(schedule.due_ns(), due_at[1]);
  // Late past faults 1 to 3: fault 1 is taken, 2 and 3 dropped, and
  // nothing more is due until fault 4's time.
  f = schedule.take_due(due_at[3], &dropped);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->victim, drawn[1].victim);
  EXPECT_EQ(f->after_ns, drawn[1].after_ns);
  EXPECT_EQ(dropped, 2);
  EXPECT_FALSE(schedule.take_due(due_at[3], &dropped));
  EXPECT_EQ(schedule.due_ns(), due_at[4]);
  EXPECT_EQ(dropped, 2);
}

Incident recovered_incident() {
  Incident i;
  i.fault_ns = 1'000 * kMs;
  i.detected_ns = 1'010 * kMs;
  i.stopped_ns = 1'050 * kMs;
  i.mesh_ns = 1'350 * kMs;
  i.ready_ns = 1'450 * kMs;
  i.recovered_ns = 1'480 * kMs;
  i.last_step = 9;
  i.resumed_from_step = 8;
  return i;
}

TEST(RecoverySplit, FivePhasesFromTheStampsAddUpToFaultToFirstStep) {
  const Incident i = recovered_incident();
  const Incident::RecoverySplit s = i.recovery_split();
  EXPECT_DOUBLE_EQ(*s.detect, 10.0);
  EXPECT_DOUBLE_EQ(*s.stop, 40.0);
  EXPECT_DOUBLE_EQ(*s.rendezvous, 300.0);
  EXPECT_DOUBLE_EQ(*s.load, 100.0);
  EXPECT_DOUBLE_EQ(*s.first_step, 30.0);
  EXPECT_EQ(i.recovery_line(),
            "detect 10 ms, stop 40 ms, rendezvous 300 ms, load 100 ms, first step 30 ms");
  const auto j = i.to_json().at("recovery_ms");
  EXPECT_DOUBLE_EQ(j.at("detect").get<double>() + j.at("stop").get<double>() +
                       j.at("rendezvous").get<double>() + j.at("load").get<double>() +
                       j.at("first_step").get<double>(),
                   i.detected_after_ms() + *i.recovered_after_ms());
  EXPECT_EQ(i.to_json().at("steps_lost"), 1);
}

TEST(RecoverySplit, AMissingOrOutOfOrderStampLeavesItsPhasesUnknown) {
  Incident i = recovered_incident();
  i.mesh_ns = 0;  // a program that does not report its phases
  Incident::RecoverySplit s = i.recovery_split();
  EXPECT_TRUE(s.stop);
  EXPECT_FALSE(s.rendezvous);
  EXPECT_FALSE(s.load);
  EXPECT_TRUE(s.first_step);
  EXPECT_EQ(i.to_json().at("recovery_ms").at("rendezvous"), nullptr);
  i = recovered_incident();
  i.ready_ns = 1'300 * kMs;  // before the mesh: a worker's bad stamp
  s = i.recovery_split();
  EXPECT_FALSE(s.load);
  EXPECT_TRUE(s.rendezvous);
  i.recovered_ns.reset();  // overtaken by the next fault
  EXPECT_FALSE(i.recovery_split().first_step);
  EXPECT_EQ(i.recovery_line(), "detect 10 ms, stop 40 ms, rendezvous 300 ms, load ?, first step ?");
}

TEST(RecoverySplit, TheSummarysWindowAndLostTimeStopAtTheNextFault) {
  // Generation 0 set up at 0.5 s, failed at 1 s; generation 1's recovery was
  // overtaken by a fault at 1.3 s; generation 2 recovered and trained to 3 s.
  std::vector<GenerationRecord> generations = {{0, 6, 400 * kMs, 500 * kMs, 990 * kMs},
                                               {-1, 0, 0, 0, 0},
                                               {5, 10, 500 * kMs, 1'900 * kMs, 3'000 * kMs}};
  // The agent's path: generation 1's worker set up at step 5 (its slot 0),
  // and failed before its first step; on that failure the agent notes where
  // the overtaken incident of generation 0 resumed from.
  Incident first = recovered_incident();
  first.generation = 0;
  first.recovered_ns.reset();
  first.resumed_from_step.reset();
  first.fault_ns = 1'000 * kMs;
  first.detected_ns = 1'001 * kMs;
  first.mean_step_ms = 50;
  std::vector<Incident> incidents = {first};
  HeartbeatTable table(1, /*generation=*/1);
  WorkerHeartbeat worker(::dup(table.fd()), /*local_rank=*/0, /*generation=*/1);
  note_resumed_from(incidents, 1, table.read(0).start_step);  // not set up yet: -1
  EXPECT_FALSE(incidents[0].resumed_from_step);
  worker.started(5, "/runs/x");
  note_resumed_from(incidents, 2, table.read(0).start_step);  // another generation's
  EXPECT_FALSE(incidents[0].resumed_from_step);
  note_resumed_from(incidents, 1, table.read(0).start_step);
  ASSERT_TRUE(incidents[0].resumed_from_step);
  EXPECT_EQ(*incidents[0].resumed_from_step, 5);
  note_resumed_from(incidents, 1, 7);  // told once
  EXPECT_EQ(*incidents[0].resumed_from_step, 5);
  Incident second;
  second.generation = 1;
  second.fault_ns = 1'300 * kMs;
  second.detected_ns = 1'301 * kMs;
  second.recovered_ns = 2'000 * kMs;
  incidents.push_back(second);
  const RunSummary s = summarize(incidents, generations, 2, 0, 3'500 * kMs);
  EXPECT_DOUBLE_EQ(s.training_s, 2.5);
  // Fault to fault, the second's recovery, and the first's steps 6 to 9
  // redone at 50 ms each.
  EXPECT_NEAR(s.lost_s, 0.3 + 0.7 + 4 * 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(s.to_json().at("training_s").get<double>(), 2.5);
  // Without a generation that set up, no window.
  EXPECT_EQ(summarize({}, {{-1, 0, 0, 0, 0}}, 0, 0, kMs).training_s, 0.0);
}

// A node that rejoins stops the job (its time is lost) but nothing failed:
// the summary counts it apart from the incidents, which the run's readers
// (chaos checks, report) hold against the failures they raised.
TEST(RecoverySplit, ARejoinIsNoIncidentButItsStopIsLostTime) {
  Incident crash = recovered_incident();
  crash.kind = "crash";
  Incident rejoin = recovered_incident();
  rejoin.kind = "rejoin";
  rejoin.fault_ns += 1'000 * kMs;
  rejoin.recovered_ns = *rejoin.recovered_ns + 1'000 * kMs;
  rejoin.resumed_from_step = rejoin.last_step;
  const RunSummary s =
      summarize({crash, rejoin}, {{0, 20, 0, 100 * kMs, 3'000 * kMs}}, 1, 0, 3'000 * kMs);
  EXPECT_EQ(s.incidents, 1);
  EXPECT_EQ(s.rejoins, 1);
  EXPECT_EQ(s.to_json().at("rejoins"), 1);
  EXPECT_NE(s.line().find("1 incident, 1 rejoin, 1 restart,"), std::string::npos) << s.line();
  // Each stopped the job from its fault to its first step after: 0.48 s,
  // and the crash's one step redone.
  EXPECT_NEAR(s.lost_s, 0.48 + 0.48 + crash.mean_step_ms * 1e-3, 1e-9);
}

// A chaos fault must not land on a worker that already exited (its
// incident would blame the fault), nor take its exit from reap().
TEST(Chaos, AnExitedWorkerNotReapedYetIsSeenAndStaysReapable) {
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char byte = 0;
    ::close(go[1]);
    const ssize_t got = ::read(go[0], &byte, 1);  // until the test says go
    ::_exit(got == 1 ? 7 : 9);
  }
  ::close(go[0]);
  EXPECT_FALSE(WorkerGroup::exited_unreaped(pid));
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(go[1]);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);  // exited
  EXPECT_TRUE(WorkerGroup::exited_unreaped(pid));
  EXPECT_TRUE(WorkerGroup::exited_unreaped(pid));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid) << "the check took the exit";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
}

TEST(RecoverySplit, TheWorkersPhasesAndTheAgentsFaultStampReachTheSlot) {
  HeartbeatTable table(2, /*generation=*/0);
  WorkerHeartbeat worker(::dup(table.fd()), /*local_rank=*/1, /*generation=*/0);
  EXPECT_EQ(table.read(1).mesh_ns, 0);
  EXPECT_EQ(table.read(1).ready_ns, 0);
  worker.mesh_formed();
  const int64_t mesh = table.read(1).mesh_ns;
  EXPECT_GT(mesh, 0);
  EXPECT_EQ(table.read(1).ready_ns, 0);
  worker.started(3, "/runs/x");
  EXPECT_GE(table.read(1).ready_ns, mesh);
  EXPECT_EQ(table.read(1).ready_ns, table.read(1).step_ns);
  EXPECT_EQ(table.read(1).peak_gflops, 0.0);
  worker.machine_peak(371.5);
  EXPECT_EQ(table.read(1).peak_gflops, 371.5);
  table.stamp_fault(1, 42);
  EXPECT_EQ(table.read(1).fault_ns, 42);
  EXPECT_EQ(table.read(0).fault_ns, 0);
  EXPECT_THROW(table.stamp_fault(2, 1), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

// The parts of issue 14's accounting and chaos mode, each alone: the chaos
// spec and its seeded schedule, the recovery time split of an incident, the
// summary's training window and lost time, and the heartbeat stamps the
// split is made of. The agent as a whole runs in tests/cli/elastic_test.cc
// and tests/cli/elastic_chaos_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incidents.h"

namespace brigade::elastic {
namespace {

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
  EXPECT_NE(error_of("chaos:mtbf=1:kinds=kill+partition").find("got 'partition'"),
            std::string::npos);
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
    EXPECT_EQ(x.kill, y.kill);
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
    kills += f.kill;
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
    EXPECT_TRUE(kill_only.next().kill);
    EXPECT_FALSE(stop_only.next().kill);
  }
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
  Incident first = recovered_incident();
  first.recovered_ns.reset();
  first.fault_ns = 1'000 * kMs;
  first.detected_ns = 1'001 * kMs;
  Incident second;
  second.fault_ns = 1'300 * kMs;
  second.detected_ns = 1'301 * kMs;
  second.recovered_ns = 2'000 * kMs;
  const RunSummary s = summarize({first, second}, generations, 2, 0, 3'500 * kMs);
  EXPECT_DOUBLE_EQ(s.training_s, 2.5);
  EXPECT_NEAR(s.lost_s, 0.3 + 0.7 + 1 * 0.0, 1e-12);  // first's steps_lost: no mean step given
  EXPECT_DOUBLE_EQ(s.to_json().at("training_s").get<double>(), 2.5);
  // Without a generation that set up, no window.
  EXPECT_EQ(summarize({}, {{-1, 0, 0, 0, 0}}, 0, 0, kMs).training_s, 0.0);
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
  table.stamp_fault(1, 42);
  EXPECT_EQ(table.read(1).fault_ns, 42);
  EXPECT_EQ(table.read(0).fault_ns, 0);
  EXPECT_THROW(table.stamp_fault(2, 1), Error);
}

}  // namespace
}  // namespace brigade::elastic

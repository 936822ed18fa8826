#include "brigade/sim/failure_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "brigade/core/error.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kE = std::exp(1.0);

// One node with a 1-hour MTBF: the job's M is exactly 3600 s, which keeps
// the hand calculations short.
FailureInputs one_hour_mtbf(double checkpoint_s, double restart_s, double work_hours) {
  return {1, 1.0, checkpoint_s, restart_s, work_hours};
}

TEST(FailureModel, JobMtbfIsNodeMtbfOverNodes) {
  // 10,000 h * 3600 s/h / 128 nodes = 281,250 s = 78.125 h.
  EXPECT_DOUBLE_EQ(job_mtbf_s({128, 10000.0, 60, 600, 100}), 281250.0);
  EXPECT_DOUBLE_EQ(job_mtbf_s({1, 1.0, 0, 0, 1}), 3600.0);
}

TEST(FailureModel, YoungAndDalyIntervalsByHand) {
  // delta = 60 s, M = 3600 s.
  // Young: sqrt(2 * 60 * 3600) = sqrt(432,000) = 657.267069006...
  EXPECT_NEAR(young_interval_s(60, 3600), 657.2670690062, 1e-9);
  // Daly: x = delta / 2M = 60 / 7200 = 1/120; sqrt(x) = 0.0912870929175.
  //   1 + sqrt(x)/3 + x/9 = 1 + 0.0304290309725 + 0.0009259259259 = 1.0313549568984
  //   657.2670690062 * 1.0313549568984 - 60 = 677.8756496256 - 60 = 617.8756496256.
  // Cross-check: sqrt(2 delta M) sqrt(x) = delta, so Daly - Young =
  // delta (-2/3 + sqrt(x)/9) = 60 * (-0.6565236563) = -39.3914193806.
  EXPECT_NEAR(daly_interval_s(60, 3600), 617.8756496256, 1e-9);
  EXPECT_NEAR(daly_interval_s(60, 3600) - young_interval_s(60, 3600), -39.3914193806, 1e-9);
}

TEST(FailureModel, DalyIsMtbfOnceCheckpointReachesTwiceMtbf) {
  EXPECT_DOUBLE_EQ(daly_interval_s(7200, 3600), 3600.0);   // delta = 2M exactly
  EXPECT_DOUBLE_EQ(daly_interval_s(50000, 3600), 3600.0);  // far beyond
  // Just below 2M the series gives x -> 1: 2M (1 + 1/3 + 1/9) - 2M = 8M/9
  // = 3200 s. (Daly's formula jumps to M there; the ETTR hardly moves.)
  EXPECT_NEAR(daly_interval_s(7200 * (1 - 1e-12), 3600), 3200.0, 1e-6);
}

TEST(FailureModel, ExpectedSegmentTimeByHand) {
  // w = M = 3600, no restart: M (e - 1) = 6185.814582...
  EXPECT_NEAR(expected_segment_s(3600, 0, 3600), 3600 * (kE - 1), 1e-9);
  EXPECT_NEAR(expected_segment_s(3600, 0, 3600), 6185.8145824526, 1e-6);
  // A failure-prone restart of R = M ln 2 multiplies it by e^{R/M} = 2. (A
  // restart that cannot fail would give (M + R)(e - 1), 1.69x.)
  EXPECT_NEAR(expected_segment_s(3600, 3600 * std::log(2.0), 3600), 12371.629164905, 1e-6);
  // No failures: the segment takes its length.
  EXPECT_DOUBLE_EQ(expected_segment_s(1234, 600, kInf), 1234.0);
}

TEST(FailureModel, ExpectedEttrByHand) {
  // tau = M = 3600, no checkpoint or restart cost: every segment takes
  // M (e - 1) on average, so ETTR = 1 / (e - 1) = 0.5819767068693.
  EXPECT_NEAR(expected_ettr(one_hour_mtbf(0, 0, 10), 3600), 0.5819767068693, 1e-12);
  // 1.5 h of work at tau = 3600: one full segment and a last one of 1800 s:
  // 3600 (e - 1) + 3600 (e^0.5 - 1) = 6185.8146 + 2335.3966 = 8521.2112 s;
  // 5400 / 8521.2112 = 0.6337127317.
  EXPECT_NEAR(expected_wall_s(one_hour_mtbf(0, 0, 1.5), 3600), 8521.211156973, 1e-6);
  EXPECT_NEAR(expected_ettr(one_hour_mtbf(0, 0, 1.5), 3600), 0.6337127317, 1e-9);
}

TEST(FailureModel, EttrWithoutFailuresIsTauOverTauPlusDelta) {
  // 10 h in segments of 3000 s + 600 s checkpoint: 3000 / 3600 = 5/6.
  const FailureInputs never_fails{64, kInf, 600, 900, 10};
  EXPECT_DOUBLE_EQ(expected_ettr(never_fails, 3000), 3000.0 / 3600.0);
  // 1.5 h at tau = 3600: (3600 + 600) + (1800 + 600) = 6600 s for 5400 s.
  EXPECT_DOUBLE_EQ(expected_ettr({64, kInf, 600, 900, 1.5}, 3600), 5400.0 / 6600.0);
  // Checkpointing only at the end: one segment of 10 h + 600 s.
  EXPECT_DOUBLE_EQ(expected_ettr(never_fails, kInf), 36000.0 / 36600.0);
}

TEST(FailureModel, EttrApproachesOneAsFailuresVanish) {
  // Free checkpoints, tau = 3600, R = 600. To first order in 1/M each
  // segment costs tau (1 + (tau/2 + R) / M): half a segment lost and one
  // restart per failure. So 1 - ETTR -> (1800 + 600) / M.
  double previous = 0;
  for (double node_mtbf_hours : {1e3, 1e6, 1e9}) {
    const FailureInputs in{1, node_mtbf_hours, 0, 600, 100};
    const double ettr = expected_ettr(in, 3600);
    EXPECT_GT(ettr, previous);
    EXPECT_LT(ettr, 1.0);
    previous = ettr;
    const double m = node_mtbf_hours * 3600;
    EXPECT_NEAR((1 - ettr) / (2400 / m), 1.0, 2e-3) << node_mtbf_hours;
  }
  EXPECT_GT(previous, 1 - 1e-9);
}

// The long-run ETTR at interval tau: one segment's compute over its
// expected time (free of the last, partial segment, which makes the
// job-level ETTR wiggle as tau varies).
double steady_ettr(double tau, double checkpoint_s, double restart_s, double mtbf_s) {
  return tau / expected_segment_s(tau + checkpoint_s, restart_s, mtbf_s);
}

TEST(FailureModel, DalyIsNearTheExactOptimumAndYoungIsNotAtLargeDelta) {
  for (double ratio : {0.01, 0.1, 1.0}) {
    const double delta = 3600 * ratio;
    // The best ETTR over intervals from M/1000 to 10 M, 0.01% apart.
    double best = 0;
    for (int i = 0; i <= 40000; ++i) {
      best = std::max(best, steady_ettr(3.6 * std::pow(10.0, i / 10000.0), delta, 300, 3600));
    }
    const double daly = steady_ettr(daly_interval_s(delta, 3600), delta, 300, 3600);
    EXPECT_LE(daly, best * (1 + 1e-9)) << ratio;
    EXPECT_GT(daly, best * (1 - 2e-3)) << ratio;
  }
  // At delta = M Young's sqrt(2) M overshoots: 12% worse than the optimum.
  EXPECT_LT(steady_ettr(young_interval_s(3600, 3600), 3600, 300, 3600),
            0.9 * steady_ettr(daly_interval_s(3600, 3600), 3600, 300, 3600));
}

// Expected compute lost over a job, worked independently of the library.
// A segment of compute c and checkpoint delta (w = c + delta) is attempted
// 1 / P(X >= w) = e^{w/M} times on average, all but the last failing; a
// failed attempt loses min(X, c), X ~ Exp(1/M) given X < w. (A failure
// during a restart loses nothing more; after it, by memorylessness, the
// next attempt is like the first.) So the segment loses
//   (e^{w/M} - 1) E[min(X, c) | X < w] = e^{w/M} E[min(X, c); X < w],
//   E[min(X, c); X < w] = M (1 - e^{-c/M} (1 + c/M)) + c (e^{-c/M} - e^{-w/M}).
double expected_lost_s(double c, double delta, double m) {
  const double w = c + delta;
  return std::exp(w / m) *
         (m * (1 - std::exp(-c / m) * (1 + c / m)) + c * (std::exp(-c / m) - std::exp(-w / m)));
}

double expected_job_lost_s(const FailureInputs& in, double tau) {
  const double m = job_mtbf_s(in), work_s = in.job_work_hours * 3600;
  const double full = std::floor(work_s / tau), last = work_s - full * tau;
  return full * expected_lost_s(tau, in.checkpoint_s, m) +
         expected_lost_s(last, in.checkpoint_s, m);
}

// The simulation against the analytic model, at seed 42. Each tolerance is
// about twice the largest deviation measured over seeds 1-30, and below the
// error a wrong model would make (noted per case). Counts (failures, lost
// work) are noisier than wall time, so they get their own tolerance.
struct McCase {
  FailureInputs in;
  int trials;
  double tolerance;        // relative, on mean ETTR and mean wall time
  double count_tolerance;  // relative, on mean failures and mean lost work
};

void expect_simulation_matches_analysis(const McCase& c) {
  const double m = job_mtbf_s(c.in);
  const double tau = daly_interval_s(c.in.checkpoint_s, m);
  const MonteCarloResult r = simulate_job(c.in, tau, c.trials, 42);
  EXPECT_EQ(r.trials, c.trials);
  EXPECT_NEAR(r.ettr_mean / expected_ettr(c.in, tau), 1.0, c.tolerance);
  EXPECT_NEAR(r.wall_hours_mean * 3600 / expected_wall_s(c.in, tau), 1.0, c.tolerance);
  // Wald's identity: failures of a Poisson process up to a stopping time
  // average E[wall] / M. Checks that failures during restarts are counted.
  EXPECT_NEAR(r.failures_mean / (r.wall_hours_mean * 3600 / m), 1.0, c.count_tolerance);
  EXPECT_NEAR(r.lost_work_hours_mean * 3600 / expected_job_lost_s(c.in, tau), 1.0,
              c.count_tolerance);
  EXPECT_LE(r.ettr_p05, r.ettr_mean);
  EXPECT_GE(r.ettr_p95, r.ettr_mean);
  EXPECT_GE(r.wall_hours_p95, r.wall_hours_mean);
}

TEST(FailureModel, SimulationMatchesAnalysisForALargeJob) {
  // 1024 nodes of 20,000 h: M = 70,312.5 s (19.5 h); 30 days of work, about
  // 40 failures per run. Largest deviation over 30 seeds: 0.05% (ETTR,
  // wall), 1.2% (counts).
  expect_simulation_matches_analysis({{1024, 20000, 120, 900, 720}, 1000, 1e-3, 2.5e-2});
}

TEST(FailureModel, SimulationMatchesAnalysisAtOneHourMtbf) {
  // About 945 failures per run; largest deviation 0.04%, 0.26%. A restart
  // that cannot fail would put the analysis off by 1 - 1.0833/1.0869 = 0.33%.
  expect_simulation_matches_analysis({one_hour_mtbf(60, 300, 720), 1000, 1e-3, 5e-3});
}

TEST(FailureModel, SimulationMatchesAnalysisWithRestartsAsLongAsHalfTheMtbf) {
  // R = M/2: failures during restarts matter. e^{R/M} = 1.6487 against
  // 1 + R/M = 1.5 for a restart that cannot fail: 10% apart. Largest
  // deviation 0.25%, 0.33%.
  expect_simulation_matches_analysis({one_hour_mtbf(60, 1800, 200), 2000, 5e-3, 1e-2});
}

TEST(FailureModel, SimulationMatchesAnalysisWithCheckpointsOfTenMinutes) {
  // delta = M/6: a fifth of failures strike during a checkpoint. They lose
  // the segment's compute, not the checkpoint's time too (counting that
  // would add 6% lost work). Largest deviation 0.26%, 0.58%.
  expect_simulation_matches_analysis({one_hour_mtbf(600, 300, 200), 1000, 5e-3, 1.5e-2});
}

TEST(FailureModel, SimulatedWallTimeIsUnbiasedForAShortJob) {
  // 3 h of work, tau = 2880 s: four segments, the last 1440 s, about 6
  // failures per run. The mean of per-run ETTRs runs ~10% above
  // work / E[wall] here (Jensen; a short job's wall time varies a lot), so
  // compare the wall time, whose mean is unbiased. Measured spread 0.4%.
  const FailureInputs in = one_hour_mtbf(300, 600, 3);
  const MonteCarloResult r = simulate_job(in, 2880, 20000, 9);
  EXPECT_NEAR(r.wall_hours_mean * 3600 / expected_wall_s(in, 2880), 1.0, 1.5e-2);
}

TEST(FailureModel, WithoutCheckpointOrRestartCostWallIsWorkPlusLostWork) {
  // delta = R = 0: every second is either kept work or work later lost.
  const FailureInputs in = one_hour_mtbf(0, 0, 100);
  const MonteCarloResult r = simulate_job(in, 1800, 200, 3);
  EXPECT_NEAR(r.wall_hours_mean, 100 + r.lost_work_hours_mean, 1e-9);
}

TEST(FailureModel, SimulationWithoutFailuresIsExact) {
  const MonteCarloResult r = simulate_job({8, kInf, 600, 900, 1.5}, 3600, 10, 1);
  EXPECT_DOUBLE_EQ(r.ettr_mean, 5400.0 / 6600.0);
  EXPECT_DOUBLE_EQ(r.ettr_p05, 5400.0 / 6600.0);
  EXPECT_DOUBLE_EQ(r.wall_hours_p95, 6600.0 / 3600.0);
  EXPECT_EQ(r.failures_mean, 0);
  EXPECT_EQ(r.lost_work_hours_mean, 0);
}

TEST(FailureModel, DalyIntervalSimulatesNoWorseThanFourTimesShorterOrLonger) {
  // M = 3600, delta = 60: Daly's 618 s. Analytically 0.762 against 0.643
  // (154 s) and 0.619 (2471 s); the runs' 5-95% spread is under +-0.02.
  const FailureInputs in = one_hour_mtbf(60, 300, 720);
  const double daly = daly_interval_s(60, 3600);
  const double at_daly = simulate_job(in, daly, 300, 5).ettr_mean;
  EXPECT_GT(at_daly, simulate_job(in, daly / 4, 300, 5).ettr_mean + 0.05);
  EXPECT_GT(at_daly, simulate_job(in, daly * 4, 300, 5).ettr_mean + 0.05);
  // Closer in, the optimum is flat: 1.25x either way is within noise.
  EXPECT_GT(at_daly, simulate_job(in, daly / 1.25, 300, 5).ettr_mean - 2e-3);
  EXPECT_GT(at_daly, simulate_job(in, daly * 1.25, 300, 5).ettr_mean - 2e-3);
}

TEST(FailureModel, SimulationIsDeterministicForASeed) {
  const FailureInputs in = one_hour_mtbf(60, 300, 100);
  const MonteCarloResult a = simulate_job(in, 600, 50, 123);
  const MonteCarloResult b = simulate_job(in, 600, 50, 123);
  EXPECT_EQ(a.ettr_mean, b.ettr_mean);
  EXPECT_EQ(a.ettr_p05, b.ettr_p05);
  EXPECT_EQ(a.ettr_p95, b.ettr_p95);
  EXPECT_EQ(a.failures_mean, b.failures_mean);
  EXPECT_EQ(a.lost_work_hours_mean, b.lost_work_hours_mean);
  EXPECT_EQ(a.wall_hours_mean, b.wall_hours_mean);
  EXPECT_EQ(a.wall_hours_p95, b.wall_hours_p95);
  const MonteCarloResult c = simulate_job(in, 600, 50, 124);
  EXPECT_NE(a.ettr_mean, c.ettr_mean);
  EXPECT_NE(a.wall_hours_mean, c.wall_hours_mean);
  // Trial t draws at counters (t, *), whatever the number of trials: a run
  // of 2 trials is the 1-trial run plus one more.
  const MonteCarloResult one = simulate_job(in, 600, 1, 123);
  const MonteCarloResult two = simulate_job(in, 600, 2, 123);
  const double first = one.wall_hours_mean, second = 2 * two.wall_hours_mean - first;
  const double lo = std::min(first, second), hi = std::max(first, second);
  EXPECT_NEAR(two.wall_hours_p95, lo + 0.95 * (hi - lo), 1e-9);
  EXPECT_NE(first, second);
}

TEST(FailureModel, ThirtyDayJobAtOneHourMtbfSimulatesQuickly) {
  // ~945 failures per run, one Philox draw each: ~30 ms at -O2. The bound
  // leaves room for sanitizer builds on shared cores; a simulation stepping
  // through time or drawing per second would take minutes.
  const auto start = std::chrono::steady_clock::now();
  const MonteCarloResult r = simulate_job(one_hour_mtbf(60, 300, 720), 618, 1000, 1);
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(r.failures_mean, 900);
  EXPECT_LT(elapsed_s, 1.0);
}

TEST(FailureModel, PlanReportsTheIntervalsAndTheEttrAtDaly) {
  const FailureInputs in{128, 10000.0, 60, 600, 720};
  const CheckpointPlan p = plan_checkpoints(in);
  EXPECT_DOUBLE_EQ(p.job_mtbf_s, 281250.0);
  // sqrt(2 * 60 * 281,250) = sqrt(33,750,000) = 5809.475 s.
  EXPECT_NEAR(p.young_s, 5809.4750193111, 1e-6);
  EXPECT_DOUBLE_EQ(p.daly_s, daly_interval_s(60, 281250.0));
  EXPECT_LT(p.daly_s, p.young_s);
  EXPECT_DOUBLE_EQ(p.ettr_at_daly, expected_ettr(in, p.daly_s));
  EXPECT_NEAR(p.wall_hours_at_daly, 720 / p.ettr_at_daly, 1e-9);
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FailureModel, BadInputsThrowErrorsNamingTheValue) {
  const FailureInputs good = one_hour_mtbf(60, 300, 10);
  auto with = [&](auto edit) {
    FailureInputs in = good;
    edit(in);
    return in;
  };
  const double nan = std::nan("");
  for (const FailureInputs& bad : {
           with([](FailureInputs& in) { in.num_nodes = 0; }),
           with([](FailureInputs& in) { in.node_mtbf_hours = 0; }),
           with([](FailureInputs& in) { in.node_mtbf_hours = -5; }),
           with([&](FailureInputs& in) { in.node_mtbf_hours = nan; }),
           with([](FailureInputs& in) { in.checkpoint_s = -1; }),
           with([](FailureInputs& in) { in.checkpoint_s = kInf; }),
           with([](FailureInputs& in) { in.restart_s = -1; }),
           with([&](FailureInputs& in) { in.restart_s = nan; }),
           with([](FailureInputs& in) { in.job_work_hours = 0; }),
           with([](FailureInputs& in) { in.job_work_hours = kInf; }),
       }) {
    EXPECT_THROW(job_mtbf_s(bad), Error);
    EXPECT_THROW(expected_ettr(bad, 600), Error);
    EXPECT_THROW(simulate_job(bad, 600, 10, 1), Error);
    EXPECT_THROW(plan_checkpoints(bad), Error);
  }
  EXPECT_NE(error_of([&] {
              job_mtbf_s(with([](FailureInputs& in) { in.node_mtbf_hours = -5; }));
            }).find("node_mtbf_hours is -5"),
            std::string::npos);

  EXPECT_THROW(expected_ettr(good, 0), Error);
  EXPECT_THROW(expected_ettr(good, nan), Error);
  EXPECT_THROW(simulate_job(good, -1, 10, 1), Error);
  EXPECT_THROW(simulate_job(good, 600, 0, 1), Error);
  EXPECT_THROW(young_interval_s(0, 3600), Error);
  EXPECT_THROW(young_interval_s(60, 0), Error);
  EXPECT_THROW(daly_interval_s(60, -1), Error);
  EXPECT_THROW(daly_interval_s(nan, 3600), Error);
  EXPECT_THROW(expected_segment_s(-1, 0, 3600), Error);
  // Free checkpoints make the optimum "always"; the plan asks for the
  // measurement instead.
  EXPECT_THROW(plan_checkpoints(one_hour_mtbf(0, 300, 10)), Error);
}

TEST(FailureModel, AJobThatCannotFinishIsRefusedNotSimulatedForever) {
  // A 20 h segment at a 1 h MTBF: e^20 = 5e8 attempts expected. The
  // analysis says "never" (ETTR ~ 0); the simulation refuses, pointing at
  // the interval.
  const FailureInputs in = one_hour_mtbf(60, 300, 100);
  EXPECT_LT(expected_ettr(in, 20 * 3600), 1e-6);
  const std::string message = error_of([&] { simulate_job(in, 20 * 3600, 10, 1); });
  EXPECT_NE(message.find("will not finish"), std::string::npos) << message;
  EXPECT_NE(message.find("interval_s"), std::string::npos) << message;
  // 1000 h in one segment: e^1000 overflows, the expected wall time is
  // +inf and the ETTR 0. Still refused.
  const FailureInputs hopeless = one_hour_mtbf(60, 300, 1000);
  EXPECT_EQ(expected_wall_s(hopeless, kInf), kInf);
  EXPECT_EQ(expected_ettr(hopeless, kInf), 0.0);
  EXPECT_THROW(simulate_job(hopeless, kInf, 10, 1), Error);
}

// A measured run in the model's terms: segments of snapshot_every steps,
// each with that many steps' saves; by hand, with M = 10 s,
// 2 steps of 1 s per snapshot and 0.1 s of saves a step, restart 1 s, 20 s of
// work: 10 segments of tau = 2, delta = 0.2, each expected
// e^(1/10) * 10 * (e^(2.2/10) - 1) s.
TEST(FailureModel, AMeasuredRunIsPredictedWithItsSnapshotIntervalAsSegments) {
  MeasuredRun run;
  run.mtbf_s = 10;
  run.step_s = 1;
  run.overhead_s = 0.1;
  run.snapshot_every = 2;
  run.restart_s = 1;
  run.work_s = 20;
  const double segment = std::exp(0.1) * 10 * (std::exp(0.22) - 1);
  EXPECT_NEAR(predicted_run_ettr(run), 20 / (10 * segment), 1e-12);
  // Without faults only the saves' time is lost.
  run.mtbf_s = kInf;
  EXPECT_NEAR(predicted_run_ettr(run), 1 / 1.1, 1e-12);
  run.step_s = 0;
  EXPECT_THROW(predicted_run_ettr(run), Error);
  run.step_s = 1;
  run.snapshot_every = 0;
  EXPECT_THROW(predicted_run_ettr(run), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

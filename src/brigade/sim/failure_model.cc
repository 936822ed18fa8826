#include "brigade/sim/failure_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"

namespace brigade::sim {
namespace {

constexpr double kSecondsPerHour = 3600.0;
constexpr double kInf = std::numeric_limits<double>::infinity();

// simulate_job() refuses runs expected to draw more failures than this in
// total: at a few tens of nanoseconds each, seconds of work. Beyond it the
// job is one that does not finish, and the analytic answer says so.
constexpr double kMaxSimulatedFailures = 2e8;

// `!(x > 0)` rather than `x <= 0` throughout, so NaN is rejected too.
void check_inputs(const FailureInputs& in) {
  if (in.num_nodes < 1) {
    throw_error("num_nodes is {}; a job needs at least 1 node", in.num_nodes);
  }
  if (!(in.node_mtbf_hours > 0)) {
    throw_error(
        "node_mtbf_hours is {}; give the mean time between failures of one node, > 0 "
        "(+inf for nodes that never fail)",
        in.node_mtbf_hours);
  }
  if (!(in.checkpoint_s >= 0) || !std::isfinite(in.checkpoint_s)) {
    throw_error("checkpoint_s is {}; give the seconds training stops per checkpoint, >= 0",
                in.checkpoint_s);
  }
  if (!(in.restart_s >= 0) || !std::isfinite(in.restart_s)) {
    throw_error("restart_s is {}; give the seconds from a failure to training again, >= 0",
                in.restart_s);
  }
  if (!(in.job_work_hours > 0) || !std::isfinite(in.job_work_hours)) {
    throw_error("job_work_hours is {}; give the hours of useful compute the job needs, > 0",
                in.job_work_hours);
  }
}

void check_interval(double interval_s) {
  if (!(interval_s > 0)) {
    throw_error(
        "checkpoint interval is {} s; it must be > 0 (use daly_interval_s(), or +inf to "
        "checkpoint only at the end)",
        interval_s);
  }
}

void check_interval_args(double checkpoint_s, double mtbf_s) {
  if (!(checkpoint_s > 0) || !std::isfinite(checkpoint_s)) {
    throw_error(
        "checkpoint_s is {}; the optimal interval needs the measured seconds one checkpoint "
        "stops training, > 0",
        checkpoint_s);
  }
  if (!(mtbf_s > 0)) {
    throw_error("mtbf_s is {}; give the job's mean time between failures, > 0", mtbf_s);
  }
}

// The job cut into segments: `full` segments of interval_s of compute, then
// one of last_s (0: none) when the work is not a multiple of the interval.
// `full` is a double: it is an integer, but may be too large for int64 when
// the interval is absurdly short, and the simulation only compares it.
struct Segments {
  double full = 0;
  double last_s = 0;
};

Segments split_work(double work_s, double interval_s) {
  if (interval_s >= work_s) return {0, work_s};
  Segments s;
  s.full = std::floor(work_s / interval_s);
  s.last_s = work_s - s.full * interval_s;
  // Rounding may leave a sliver (W = 3 tau computed as 3 tau + 1 ulp); a
  // sliver would cost a whole extra checkpoint, so it is not a segment.
  if (s.last_s <= 1e-9 * interval_s) s.last_s = 0;
  return s;
}

// Linear interpolation between order statistics of sorted `v` (NumPy's and
// R's default).
double percentile(const std::vector<double>& sorted, double p) {
  const double h = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

struct TrialOutcome {
  double wall_s = 0;
  double lost_s = 0;
  int64_t failures = 0;
};

// One run of the job. The time to the next failure is drawn once per
// failure and carried across segments: failures are memoryless, so the
// time left to the next one after surviving a segment is again exponential
// with the same mean, and a draw per segment attempt would be the same
// process at the cost of one draw per checkpoint. The full segments it
// spans are skipped in one step.
TrialOutcome simulate_trial(const Segments& seg, double interval_s, double checkpoint_s,
                            double restart_s, double mtbf_s, uint64_t seed, uint64_t trial) {
  uint64_t draw = 0;
  auto time_to_failure = [&]() {
    if (std::isinf(mtbf_s)) return kInf;
    // 53 random bits mapped onto (0, 1]: never log(0).
    const double u = static_cast<double>((Philox::u64(seed, trial, draw++) >> 11) + 1) * 0x1p-53;
    return -std::log(u) * mtbf_s;
  };

  const double full_seg_s = interval_s + checkpoint_s;
  const double last_seg_s = seg.last_s + checkpoint_s;
  TrialOutcome out;
  double full_left = seg.full;
  double x = time_to_failure();  // from now to the next failure
  for (;;) {
    // Run forward from the last completed checkpoint. Every exit from this
    // block either finishes the job or puts `x` inside an unfinished segment.
    double compute_s = 0;  // the unfinished segment's compute
    if (full_left > 0) {
      double k = std::min(full_left, std::floor(x / full_seg_s));
      if (k > 0 && k * full_seg_s > x) k -= 1;  // floor of a rounded quotient
      out.wall_s += k * full_seg_s;
      x -= k * full_seg_s;
      full_left -= k;
      compute_s = interval_s;
    }
    if (full_left == 0) {
      if (seg.last_s == 0 || x >= last_seg_s) {
        if (seg.last_s > 0) out.wall_s += last_seg_s;
        return out;
      }
      compute_s = seg.last_s;
    }
    // The failure strikes `x` into the segment: its compute so far is lost.
    out.wall_s += x;
    out.lost_s += std::min(x, compute_s);
    ++out.failures;
    // Restart; a failure during it starts it over.
    for (x = time_to_failure(); x < restart_s; x = time_to_failure()) {
      out.wall_s += x;
      ++out.failures;
    }
    out.wall_s += restart_s;
    x -= restart_s;
  }
}

}  // namespace

double job_mtbf_s(const FailureInputs& in) {
  check_inputs(in);
  return in.node_mtbf_hours * kSecondsPerHour / static_cast<double>(in.num_nodes);
}

double young_interval_s(double checkpoint_s, double mtbf_s) {
  check_interval_args(checkpoint_s, mtbf_s);
  return std::sqrt(2.0 * checkpoint_s * mtbf_s);
}

double daly_interval_s(double checkpoint_s, double mtbf_s) {
  check_interval_args(checkpoint_s, mtbf_s);
  // Past delta = 2M the series diverges; Daly's paper takes tau = M there.
  if (checkpoint_s >= 2.0 * mtbf_s) return mtbf_s;
  const double x = checkpoint_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) -
         checkpoint_s;
}

// Let X ~ Exp(1/M) be the time to the next failure from the segment's
// start. If X >= w the segment takes w; otherwise it takes X, then a
// restart (expected time E[Rec]), then the whole segment again from a
// fresh start:
//   E[T] = E[min(X, w)] + P(X < w) (E[Rec] + E[T])
// with E[min(X, w)] = M (1 - e^{-w/M}) and P(X < w) = 1 - e^{-w/M}, so
//   E[T] = M (e^{w/M} - 1) (1 + E[Rec] / M).
// The restart is failure-prone work of length R that redoes only itself:
// the same equation with nothing after the failure gives
// E[Rec] = M (e^{R/M} - 1), hence E[T] = e^{R/M} M (e^{w/M} - 1).
// This is the standard result (Herault & Robert, eds., "Fault-Tolerance
// Techniques for High-Performance Computing", Springer 2015, ch. 1:
// e^{lambda R} (1/lambda + D) (e^{lambda (W + C)} - 1) with downtime D = 0;
// Bougeret et al., "Checkpointing strategies for parallel jobs", SC'11).
// The often-quoted (M + R)(e^{w/M} - 1) is the same for a restart that
// cannot fail; it is short by about (R/M)^2 / 2, which a long restart on a
// big job makes visible. expm1 keeps w << M exact; overflow gives +inf,
// which is the right answer for a segment that will not finish.
double expected_segment_s(double work_s, double restart_s, double mtbf_s) {
  if (!(work_s >= 0) || !(restart_s >= 0) || !(mtbf_s > 0)) {
    throw_error(
        "expected_segment_s(work_s={}, restart_s={}, mtbf_s={}): work and restart must be "
        ">= 0 and the MTBF > 0",
        work_s, restart_s, mtbf_s);
  }
  if (std::isinf(mtbf_s)) return work_s;
  return std::exp(restart_s / mtbf_s) * mtbf_s * std::expm1(work_s / mtbf_s);
}

double expected_wall_s(const FailureInputs& in, double interval_s) {
  const double mtbf_s = job_mtbf_s(in);
  check_interval(interval_s);
  const Segments seg = split_work(in.job_work_hours * kSecondsPerHour, interval_s);
  double wall_s = 0;
  if (seg.full > 0) {
    wall_s += seg.full * expected_segment_s(interval_s + in.checkpoint_s, in.restart_s, mtbf_s);
  }
  if (seg.last_s > 0) {
    wall_s += expected_segment_s(seg.last_s + in.checkpoint_s, in.restart_s, mtbf_s);
  }
  return wall_s;
}

double expected_ettr(const FailureInputs& in, double interval_s) {
  return in.job_work_hours * kSecondsPerHour / expected_wall_s(in, interval_s);
}

MonteCarloResult simulate_job(const FailureInputs& in, double interval_s, int trials,
                              uint64_t seed) {
  const double mtbf_s = job_mtbf_s(in);
  check_interval(interval_s);
  if (trials < 1) throw_error("trials is {}; simulate at least 1 run (1000 is typical)", trials);
  // A failure process stopped at the job's end still has E[failures] =
  // E[wall] / M (Wald's identity for the Poisson process).
  const double expected_wall = expected_wall_s(in, interval_s);
  const double expected_failures = expected_wall / mtbf_s;
  if (!(expected_failures * trials <= kMaxSimulatedFailures)) {
    throw_error(
        "simulate_job: each run is expected to fail {:.3g} times (expected wall {:.3g} h for "
        "{} h of work with job MTBF {:.0f} s), too many to simulate {} runs; the job will not "
        "finish. Shorten interval_s (daly_interval_s() gives {:.0f} s) or the checkpoint",
        expected_failures, expected_wall / kSecondsPerHour, in.job_work_hours, mtbf_s, trials,
        in.checkpoint_s > 0 ? daly_interval_s(in.checkpoint_s, mtbf_s) : 0.0);
  }

  const double work_s = in.job_work_hours * kSecondsPerHour;
  const Segments seg = split_work(work_s, interval_s);
  std::vector<double> ettr(trials), wall_h(trials);
  double failures_sum = 0, lost_s_sum = 0;
  for (int t = 0; t < trials; ++t) {
    const TrialOutcome o = simulate_trial(seg, interval_s, in.checkpoint_s, in.restart_s, mtbf_s,
                                          seed, static_cast<uint64_t>(t));
    ettr[t] = work_s / o.wall_s;
    wall_h[t] = o.wall_s / kSecondsPerHour;
    failures_sum += static_cast<double>(o.failures);
    lost_s_sum += o.lost_s;
  }

  MonteCarloResult r;
  r.trials = trials;
  double ettr_sum = 0, wall_h_sum = 0;
  for (int t = 0; t < trials; ++t) {
    ettr_sum += ettr[t];
    wall_h_sum += wall_h[t];
  }
  r.ettr_mean = ettr_sum / trials;
  r.wall_hours_mean = wall_h_sum / trials;
  r.failures_mean = failures_sum / trials;
  r.lost_work_hours_mean = lost_s_sum / trials / kSecondsPerHour;
  std::sort(ettr.begin(), ettr.end());
  std::sort(wall_h.begin(), wall_h.end());
  r.ettr_p05 = percentile(ettr, 0.05);
  r.ettr_p95 = percentile(ettr, 0.95);
  r.wall_hours_p95 = percentile(wall_h, 0.95);
  return r;
}

CheckpointPlan plan_checkpoints(const FailureInputs& in) {
  CheckpointPlan p;
  p.job_mtbf_s = job_mtbf_s(in);
  p.young_s = young_interval_s(in.checkpoint_s, p.job_mtbf_s);
  p.daly_s = daly_interval_s(in.checkpoint_s, p.job_mtbf_s);
  p.wall_hours_at_daly = expected_wall_s(in, p.daly_s) / kSecondsPerHour;
  p.ettr_at_daly = in.job_work_hours / p.wall_hours_at_daly;
  return p;
}

double predicted_run_ettr(const MeasuredRun& run) {
  if (!(run.step_s > 0) || !std::isfinite(run.step_s)) {
    throw_error("the run's mean step time is {} s; it needs steps that took time", run.step_s);
  }
  if (run.snapshot_every < 1) {
    throw_error(
        "snapshot_every is {}; give the steps between snapshots (or checkpoints) the run took, "
        ">= 1",
        run.snapshot_every);
  }
  FailureInputs in;
  in.num_nodes = 1;
  in.node_mtbf_hours = run.mtbf_s / kSecondsPerHour;
  in.checkpoint_s = static_cast<double>(run.snapshot_every) * std::max(0.0, run.overhead_s);
  in.restart_s = std::max(0.0, run.restart_s);
  in.job_work_hours = run.work_s / kSecondsPerHour;
  return expected_ettr(in, static_cast<double>(run.snapshot_every) * run.step_s);
}

}  // namespace brigade::sim

// The planner's failure model: how often a job fails, how often it should
// checkpoint, and what fraction of its wall time is useful training (the
// effective-training-time ratio, ETTR = useful compute / wall time).
//
// The model. Nodes fail independently with exponentially distributed times
// between failures; one node failing stops the whole job, so the job fails
// as a Poisson process of rate 1/M, M = node MTBF / nodes. The job runs
// segments of `interval_s` of useful compute, each followed by a checkpoint
// of `checkpoint_s` during which training is stopped. A failure at any
// moment (computing, checkpointing, or restarting) throws away the work
// since the last *completed* checkpoint and costs a restart of `restart_s`,
// which can itself be struck by a failure and then starts over.
//
// Every segment ends with a checkpoint, including the last, shorter one:
// a job is not done until its final weights are on disk. So with no
// failures and job_work a multiple of the interval, ETTR = tau / (tau + delta).
// Wall time runs from the first step to the last checkpoint; queueing and
// the first start-up are outside the model.
//
// Two ways to get ETTR: expected_ettr() is the exact analytic expectation,
// simulate_job() a Monte Carlo event simulation of the same model that also
// gives the spread (a 30-day job is one sample, not an average). They agree
// to within the simulation's noise; the tests hold them to it.
#pragma once

#include <cstdint>

namespace brigade::sim {

struct FailureInputs {
  int64_t num_nodes = 1;
  double node_mtbf_hours = 0;  // mean time between failures of ONE node; +inf: never fails
  double checkpoint_s = 0;     // training stopped per checkpoint
  double restart_s = 0;        // detect + reschedule + reload after a failure
  double job_work_hours = 0;   // useful compute the job needs
};

// The job's MTBF: node_mtbf_hours * 3600 / num_nodes (the minimum of N
// exponentials is exponential with N times the rate). Error for
// num_nodes < 1 or node_mtbf_hours <= 0.
double job_mtbf_s(const FailureInputs& in);

// Young (1974): the compute time between checkpoints that minimises the
// first-order waste delta/tau + tau/(2M): sqrt(2 * checkpoint_s * mtbf_s).
// Good when checkpoint_s << mtbf_s. Error unless both are > 0.
double young_interval_s(double checkpoint_s, double mtbf_s);

// Daly (2006), "A higher order estimate of the optimum checkpoint interval
// for restart dumps", FGCS 22(3): with x = delta / (2M),
//   sqrt(2 delta M) * (1 + sqrt(x)/3 + x/9) - delta   for delta < 2M,
//   M                                                  otherwise.
// Always shorter than Young's (it accounts for failures during the
// checkpoint itself); its expected_ettr() is within 0.2% of the exact
// optimum for every delta / M, where Young's falls 12% short at delta = M.
// The restart cost does not move the optimum in this model (it multiplies
// every segment's expected time by the same factor). Error unless both
// are > 0.
double daly_interval_s(double checkpoint_s, double mtbf_s);

// Expected wall time to complete `work_s` of failure-prone work that must
// run uninterrupted (a segment: compute + its checkpoint), from a fresh
// start, when a failure costs a failure-prone restart of restart_s:
//   exp(restart_s / M) * M * (exp(work_s / M) - 1).
// The exact renewal-theory result for exponential failures; see the .cc.
double expected_segment_s(double work_s, double restart_s, double mtbf_s);

// Exact expected wall time of the whole job checkpointing every interval_s
// of compute: floor(W / tau) full segments of tau + delta and, if W is not
// a multiple of tau, one last segment of the remainder + delta, each
// expected_segment_s(). +inf when the job is not expected to finish (an
// interval or checkpoint far beyond the MTBF). Error for invalid inputs or
// interval_s <= 0 (+inf means one checkpoint, at the end).
double expected_wall_s(const FailureInputs& in, double interval_s);

// job_work / expected_wall_s(): the ratio of expectations. The mean of
// per-run ratios (what simulate_job() reports) is larger by about the
// squared coefficient of variation of the wall time, which is negligible
// for any job with many failures.
double expected_ettr(const FailureInputs& in, double interval_s);

struct MonteCarloResult {
  int trials = 0;
  double ettr_mean = 0, ettr_p05 = 0, ettr_p95 = 0;
  double failures_mean = 0;         // including failures during restarts
  double lost_work_hours_mean = 0;  // compute thrown away (not checkpoint or restart time)
  double wall_hours_mean = 0;
  double wall_hours_p95 = 0;
};

// Simulates `trials` runs of the job, each from start to its final
// checkpoint. Percentiles interpolate linearly between order statistics.
// Deterministic for a seed: trial t's failures are Philox draws at counter
// (t, 0), (t, 1), ..., so the first N trials of a larger run are exactly a
// run of N trials. Costs O(failures) per trial, not O(segments): by
// memorylessness one draw per failure serves all the segments it spans.
// Error for invalid inputs, trials < 1, or a job expected to draw more
// failures than can be simulated in seconds (an interval or checkpoint
// that the MTBF will not let finish).
MonteCarloResult simulate_job(const FailureInputs& in, double interval_s, int trials,
                              uint64_t seed);

// What the planner reports about checkpointing.
struct CheckpointPlan {
  double job_mtbf_s = 0;
  double young_s = 0;
  double daly_s = 0;  // the interval to use
  double ettr_at_daly = 0;
  double wall_hours_at_daly = 0;
};

// Error for invalid inputs, including checkpoint_s == 0 (the optimum is
// then to checkpoint continuously, which says the measurement is missing).
CheckpointPlan plan_checkpoints(const FailureInputs& in);

// A training run's measured figures (`brigade ettr RUN_DIR`), to hold the
// model against what the run did. A segment is `snapshot_every` steps: its
// compute is their training time (a step's time on the training loop's
// clock, the loop's own work between steps included, less its saves and
// evaluations: what the run counts as productive, elastic/incidents.h; a
// snapshot's copy overlaps the next step and slows it, which shows in that
// time, as it does in the run's), its "checkpoint" the time those steps
// spent on saves and evaluations (a snapshot's start and the update's wait
// for its copy, background checkpoints' copies). The wall time the model
// predicts runs from the first step to the last: the run's first start-up
// and its end are outside it, as they are outside the failure model.
struct MeasuredRun {
  double mtbf_s = 0;           // the job's mean time between faults
  double step_s = 0;           // mean training time of one step
  double overhead_s = 0;       // mean time of one step spent on saves and evaluations
  int64_t snapshot_every = 1;  // steps per snapshot (or checkpoint)
  double restart_s = 0;        // mean fault to training again (recovery less its first step)
  double work_s = 0;           // the run's kept training time
};

// The model's ETTR for the run: expected_ettr() of one node of MTBF mtbf_s,
// checkpoint_s = snapshot_every * overhead_s, interval_s =
// snapshot_every * step_s, restart_s, work_s. Error for invalid figures.
double predicted_run_ettr(const MeasuredRun& run);

}  // namespace brigade::sim

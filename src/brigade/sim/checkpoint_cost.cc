#include "brigade/sim/checkpoint_cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"

namespace brigade::sim {

CheckpointReport checkpoint_report(const Workload& job, const Estimate& plan, const Hardware& hw,
                                   const FailureOptions& options) {
  CheckpointReport r;
  const Layout& l = plan.layout;
  const double gpus = static_cast<double>(l.gpus());
  r.nodes = std::max<int64_t>(1, (l.gpus() + hw.gpus_per_node - 1) / hw.gpus_per_node);
  const double params = model_params(job.model, job.seq_len);
  r.state_bytes = params * (job.features.param_bytes + job.features.optimizer_bytes);
  // Every GPU snapshots its share: the model-parallel shard, split further
  // across dp when ZeRO shards the optimizer state (otherwise dp rank 0 of
  // each shard writes it all).
  const double writers = l.zero >= 1 ? gpus : static_cast<double>(l.tp * l.pp);
  r.snapshot_s = r.state_bytes / writers / hw.host_copy_bytes_per_s;
  const double storage = options.storage_gb_per_s * 1e9;
  r.persist_s = r.state_bytes / storage;
  r.restart_s = options.restart_s + r.state_bytes / storage;
  const double tokens = options.train_tokens > 0 ? options.train_tokens : 20.0 * params;
  r.job_work_hours = tokens / plan.tokens_per_s / 3600.0;

  FailureInputs in;
  in.num_nodes = r.nodes;
  in.node_mtbf_hours = options.node_mtbf_hours;
  in.checkpoint_s = r.snapshot_s;
  in.restart_s = r.restart_s;
  in.job_work_hours = r.job_work_hours;
  r.job_mtbf_s = job_mtbf_s(in);
  r.young_s = young_interval_s(r.snapshot_s, r.job_mtbf_s);
  r.daly_s = daly_interval_s(r.snapshot_s, r.job_mtbf_s);
  r.interval_s = std::max(r.daly_s, r.persist_s);
  r.expected_ettr = expected_ettr(in, r.interval_s);
  // A job that fails thousands of times cannot be simulated a thousand
  // times over in a second: the analytic ETTR above still stands.
  try {
    r.monte_carlo = simulate_job(in, r.interval_s, options.trials, options.seed);
  } catch (const Error& e) {
    r.monte_carlo_skipped = e.what();
  }
  return r;
}

nlohmann::json checkpoint_json(const CheckpointReport& r) {
  const MonteCarloResult& mc = r.monte_carlo;
  return {{"nodes", r.nodes},
          {"state_gib", r.state_bytes / (1024.0 * 1024.0 * 1024.0)},
          {"snapshot_s", r.snapshot_s},
          {"persist_s", r.persist_s},
          {"restart_s", r.restart_s},
          {"job_work_hours", r.job_work_hours},
          {"job_mtbf_hours", r.job_mtbf_s / 3600.0},
          {"young_interval_s", r.young_s},
          {"daly_interval_s", r.daly_s},
          {"interval_s", r.interval_s},
          {"expected_ettr", r.expected_ettr},
          {"monte_carlo_skipped", r.monte_carlo_skipped},
          {"monte_carlo",
           {{"trials", mc.trials},
            {"ettr_mean", mc.ettr_mean},
            {"ettr_p05", mc.ettr_p05},
            {"ettr_p95", mc.ettr_p95},
            {"failures_mean", mc.failures_mean},
            {"lost_work_hours_mean", mc.lost_work_hours_mean},
            {"wall_hours_mean", mc.wall_hours_mean},
            {"wall_hours_p95", mc.wall_hours_p95}}}};
}

std::string format_checkpoint_report(const CheckpointReport& r) {
  const MonteCarloResult& mc = r.monte_carlo;
  std::string out = "\nFailures and checkpoints\n";
  out += fmt::format(
      "  {} nodes -> job MTBF {:.2f} h; checkpoint of {:.0f} GiB: {:.1f} s snapshot (training "
      "stops), {:.0f} s to persist; restart {:.0f} s\n",
      r.nodes, r.job_mtbf_s / 3600.0, r.state_bytes / (1024.0 * 1024.0 * 1024.0), r.snapshot_s,
      r.persist_s, r.restart_s);
  out += fmt::format(
      "  interval: Young {:.0f} s, Daly {:.0f} s -> checkpoint every {:.0f} s of training\n",
      r.young_s, r.daly_s, r.interval_s);
  if (mc.trials == 0) {
    out += fmt::format("  job of {:.0f} h of training: expected ETTR {:.3f}; no Monte Carlo: {}\n",
                       r.job_work_hours, r.expected_ettr, r.monte_carlo_skipped);
    return out;
  }
  out += fmt::format(
      "  job of {:.0f} h of training: expected ETTR {:.3f}; Monte Carlo ({} runs): ETTR {:.3f} "
      "(5-95%: {:.3f}-{:.3f}), {:.1f} failures, {:.1f} h of work lost, {:.0f} h wall (p95 {:.0f} "
      "h)\n",
      r.job_work_hours, r.expected_ettr, mc.trials, mc.ettr_mean, mc.ettr_p05, mc.ettr_p95,
      mc.failures_mean, mc.lost_work_hours_mean, mc.wall_hours_mean, mc.wall_hours_p95);
  return out;
}

}  // namespace brigade::sim

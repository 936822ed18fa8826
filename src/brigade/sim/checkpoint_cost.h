// How often to checkpoint a planned job, and what failures cost it.
//
// A checkpoint stops training only for the snapshot to host memory (Brigade
// saves asynchronously); persisting to storage runs in the background but
// bounds how often one can start. A failure costs the restart (detection,
// rescheduling, loading the checkpoint back) plus the work since the last
// checkpoint. The interval is Daly's optimum for the snapshot cost.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "brigade/sim/cost_model.h"
#include "brigade/sim/failure_model.h"

namespace brigade::sim {

struct FailureOptions {
  // Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions
  // in 54 days on 16,384 H100s = 2,048 nodes, i.e. one failure per
  // 54 * 24 * 2048 / 419 ~ 6,300 node-hours.
  double node_mtbf_hours = 6300;
  double restart_s = 600;         // detect + reschedule + restart, before loading
  double storage_gb_per_s = 200;  // aggregate write/read bandwidth of the checkpoint store
  double train_tokens = 0;        // 0: 20 tokens per parameter (Hoffmann et al. 2022)
  int trials = 1000;              // Monte Carlo trials
  uint64_t seed = 1;
};

struct CheckpointReport {
  int64_t nodes = 0;
  double state_bytes = 0;  // weights + optimizer state of the whole model
  double snapshot_s = 0;   // training stopped per checkpoint
  double persist_s = 0;    // background write of one checkpoint
  double restart_s = 0;    // per failure, including reading the checkpoint
  double job_work_hours = 0;
  double job_mtbf_s = 0;
  double young_s = 0, daly_s = 0;
  double interval_s = 0;  // Daly's, but never shorter than persisting takes
  double expected_ettr = 0;
  MonteCarloResult monte_carlo;     // trials == 0 when it could not run
  std::string monte_carlo_skipped;  // why not, then
};

CheckpointReport checkpoint_report(const Workload& job, const Estimate& plan, const Hardware& hw,
                                   const FailureOptions& options);
nlohmann::json checkpoint_json(const CheckpointReport& report);
std::string format_checkpoint_report(const CheckpointReport& report);

}  // namespace brigade::sim

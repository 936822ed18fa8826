// The layout a training config runs as, in the planner's terms. `brigade
// plan --model CONFIG --gpus N --layout config [--set ...]` predicts the step
// of the very run that `brigade train --nproc N CONFIG [--set ...]` starts:
// bench/check_plan_local.py hands both the same config and overrides, so a
// prediction and the measurement it is compared with cannot describe two
// different jobs (a tp 2 run planned as dp 2, a grad_accum left out).
#pragma once

#include <cstdint>

#include "brigade/core/config.h"
#include "brigade/sim/layout.h"

namespace brigade::cli {

struct TrainingLayout {
  sim::Layout layout;
  int64_t global_batch = 0;  // sequences per optimizer step: micro_batch x grad_accum x dp
  int64_t threads = 0;       // train.threads: each worker's; 0: the cores / the workers
};

// The run on `processes` workers, as `brigade train --nproc` starts it:
// parallel.tp and parallel.pp from the config, dp = processes / (tp * pp),
// the schedule, ZeRO stage, sequence parallelism, recompute and micro-batch
// the workers read (sequence parallelism only with tp > 1, as the model runs
// it). Throws Error, with the fix, when tp * pp does not divide `processes`,
// when the config's parallel.dp disagrees, when the config fails the checks
// training would make of it (the model's tp and sequence parallel
// constraints, an unknown schedule, pp > n_layer, a key training never
// reads), and for what the planner cannot yet cost: model.recompute =
// "selective", and pipeline stages split_stages cuts unequally.
TrainingLayout training_layout(const Config& config, int64_t processes);

}  // namespace brigade::cli

// The planner's pipeline: the schedule's own instruction lists (schedule/)
// simulated under the cost model's per-stage times, instead of a closed-form
// bubble. Results are cached, so a search over thousands of layouts runs
// each distinct simulation once.
#pragma once

#include <cstdint>

#include "brigade/schedule/simulate.h"

namespace brigade::sim {

struct PipelineCosts {
  // Per micro-batch: the first stage (embedding), a middle one, the last
  // (LM head and loss). With one stage, `first` holds all of it.
  schedule::StageCosts first, middle, last;
};

struct PipelineResult {
  double step_s = 0;  // the stages' compute with their fill, drain and waits
  // Activations alive at the peak, in micro-batches of the stage's layers.
  double live_first = 0, live_last = 0;
};

// Throws Error (schedule::check's) for a shape the schedule cannot run.
PipelineResult simulate_pipeline(const schedule::Shape& shape, const PipelineCosts& costs);

// Simulations run by this process (cache misses), for tests of the cache.
int64_t pipeline_simulations_run();

}  // namespace brigade::sim

#include "brigade/sim/pipeline.h"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "brigade/core/error.h"

namespace brigade::sim {
namespace {

std::atomic<int64_t> simulations{0};

// Groups of p micro-batches after which every schedule is in its steady
// state: step time and live activations grow linearly in m. Measured over
// uneven stage costs (first or last stage up to 25x the other), p up to 32
// and v up to 8, the line starts by 2 groups (interleaved: its warm-up runs
// up to 2p-1 chunk passes more than a group); 3 leaves a margin.
constexpr int64_t kSteadyFrom = 3;

// Step time scales with the costs (every path through the schedule is a sum
// of them), so the cache keys on the costs relative to the first stage's
// forward: layouts that differ only in their ZeRO stage share one
// simulation, as do devices that differ only by a constant speed factor.
using Key = std::tuple<int, int64_t, int64_t, int64_t, std::vector<double>>;

// The full simulation, with costs divided by `unit`.
PipelineResult simulate_normalised(const schedule::Shape& shape, const PipelineCosts& costs,
                                   double unit) {
  schedule::Costs sc;
  sc.stages.clear();
  for (int64_t s = 0; s < shape.stages; ++s) {
    const schedule::StageCosts& c = s == 0                  ? costs.first
                                    : s == shape.stages - 1 ? costs.last
                                                            : costs.middle;
    sc.stages.push_back({c.forward / unit, c.backward_input / unit, c.backward_weight / unit});
  }
  thread_local std::vector<std::vector<schedule::Instruction>> lists;
  schedule::all_stage_instructions(shape, lists);
  const schedule::Simulation run = schedule::simulate(lists, sc, /*keep_intervals=*/false);
  BRIGADE_CHECK(run.ok, "the {} schedule failed to simulate: {}", schedule::kind_name(shape.kind),
                run.problem);
  ++simulations;
  PipelineResult r;
  r.step_s = run.step_s;
  r.live_first = run.stages.front().peak_live_microbatches;
  r.live_last = run.stages.back().peak_live_microbatches;
  return r;
}

}  // namespace

PipelineResult simulate_pipeline(const schedule::Shape& shape, const PipelineCosts& costs) {
  schedule::check(shape);
  const double unit = costs.first.forward > 0 ? costs.first.forward : 1.0;
  std::vector<double> ratios;
  for (const schedule::StageCosts* c : {&costs.first, &costs.middle, &costs.last}) {
    ratios.insert(ratios.end(),
                  {c->forward / unit, c->backward_input / unit, c->backward_weight / unit});
  }
  const Key key{static_cast<int>(shape.kind), shape.stages, shape.microbatches,
                shape.virtual_stages, ratios};
  static std::mutex mutex;
  static std::map<Key, PipelineResult> cache;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find(key);
    if (found != cache.end()) {
      PipelineResult r = found->second;
      r.step_s *= unit;
      return r;
    }
  }

  PipelineResult r;
  const int64_t p = shape.stages, m = shape.microbatches;
  // Interleaved repeats every group of p micro-batches, the others every one.
  const int64_t period = shape.kind == schedule::Kind::kInterleaved ? p : 1;
  const int64_t steady = kSteadyFrom * p;
  if (m <= steady + period) {
    r = simulate_normalised(shape, costs, unit);
  } else {
    // Past the fill, every further period adds the same time and memory:
    // simulate two points there and extend the line. The anchors are cached
    // too, and shared by every larger m; the tests check the line against
    // the full simulation.
    schedule::Shape at = shape;
    at.microbatches = steady;
    const PipelineResult a = simulate_pipeline(at, costs);
    at.microbatches += period;
    const PipelineResult b = simulate_pipeline(at, costs);
    const double periods = static_cast<double>(m - at.microbatches) / static_cast<double>(period);
    r.step_s = (b.step_s + periods * (b.step_s - a.step_s)) / unit;
    r.live_first = b.live_first + periods * (b.live_first - a.live_first);
    r.live_last = b.live_last + periods * (b.live_last - a.live_last);
  }
  {
    const std::lock_guard<std::mutex> lock(mutex);
    cache.emplace(key, r);
  }
  r.step_s *= unit;
  return r;
}

int64_t pipeline_simulations_run() {
  return simulations.load();
}

}  // namespace brigade::sim

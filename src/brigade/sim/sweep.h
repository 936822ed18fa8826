// Scale what-ifs: the same job planned on more and more GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/sim/search.h"

namespace brigade::sim {

struct SweepPoint {
  int64_t gpus = 0;
  bool feasible = false;
  Estimate fastest;        // the best layout at this scale
  Estimate least_waiting;  // least waiting share among layouts within 5% of the fastest
};

struct GpuSweep {
  std::vector<SweepPoint> points;
};

// "1024:16384" -> 1024, 2048, ..., 16384 (HI is always the last point:
// "1024:3072" -> 1024, 2048, 3072). Throws Error on a bad range.
std::vector<int64_t> parse_gpu_range(const std::string& text);
GpuSweep sweep_gpus(const Workload& job, const Hardware& hw, const std::vector<int64_t>& gpus);

}  // namespace brigade::sim

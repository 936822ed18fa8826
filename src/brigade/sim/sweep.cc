#include "brigade/sim/sweep.h"

#include <charconv>

#include "brigade/core/error.h"

namespace brigade::sim {

std::vector<int64_t> parse_gpu_range(const std::string& text) {
  const size_t colon = text.find(':');
  int64_t lo = 0, hi = 0;
  const bool ok =
      colon != std::string::npos &&
      std::from_chars(text.data(), text.data() + colon, lo).ptr == text.data() + colon &&
      std::from_chars(text.data() + colon + 1, text.data() + text.size(), hi).ptr ==
          text.data() + text.size();
  constexpr int64_t kMostGpus = int64_t{1} << 24;
  if (!ok || lo <= 0 || hi < lo || hi > kMostGpus) {
    throw_error("--sweep-gpus must be LO:HI with 0 < LO <= HI <= {} (e.g. 1024:16384), got \"{}\"",
                kMostGpus, text);
  }
  std::vector<int64_t> gpus;
  for (int64_t n = lo; n <= hi; n *= 2) gpus.push_back(n);
  if (gpus.back() != hi) gpus.push_back(hi);  // 1024:3072 ends at 3072
  return gpus;
}

GpuSweep sweep_gpus(const Workload& job, const Hardware& hw, const std::vector<int64_t>& gpus) {
  GpuSweep sweep;
  for (int64_t n : gpus) {
    SweepPoint point;
    point.gpus = n;
    // Enough of the ranking to find a near-best layout that waits least.
    const SearchResult result = search_layouts(job, n, hw, {}, 200);
    if (!result.ranked.empty()) {
      point.feasible = true;
      point.fastest = result.ranked.front();
      point.least_waiting = point.fastest;
      auto waiting_share = [](const Estimate& e) { return e.time.waiting_s() / e.time.step_s(); };
      for (const Estimate& e : result.ranked) {
        if (e.time.step_s() > 1.05 * point.fastest.time.step_s()) break;
        if (waiting_share(e) < waiting_share(point.least_waiting)) point.least_waiting = e;
      }
    }
    sweep.points.push_back(std::move(point));
  }
  return sweep;
}

}  // namespace brigade::sim

#include "brigade/train/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "brigade/core/error.h"

namespace brigade {
namespace {

double median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
}

// The median of `sorted` (ascending, 2 or more values) without one value
// equal to `v`: O(log n) rather than a copy per rank, for jobs of
// thousands of ranks.
double median_without(const std::vector<double>& sorted, double v) {
  const auto skip =
      static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), v) - sorted.begin());
  const auto at = [&](size_t k) { return sorted[k < skip ? k : k + 1]; };
  const size_t m = sorted.size() - 1;
  return m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
}

}  // namespace

std::string StragglerEvent::line() const {
  const std::string verb = section == "compute" ? "computes" : "spends in " + section;
  if (started) {
    return fmt::format(
        "straggler: rank {} (node {}) {} {:.1f}x slower than the median rank over steps {}-{} "
        "(section: {}; {:.2f} ms against {:.2f} ms on a core, and {:.2f} ms waiting for one)",
        rank, node, verb, ratio, first_step, last_step, section, median_ms, others_median_ms,
        runqueue_ms);
  }
  return fmt::format(
      "straggler: rank {} (node {}) is no longer slow over steps {}-{} ({:.1f}x the median rank, "
      "section: {})",
      rank, node, first_step, last_step, ratio, section);
}

StragglerDetector::StragglerDetector(std::string section, std::vector<int> nodes,
                                     StragglerOptions options)
    : section_(std::move(section)),
      nodes_(std::move(nodes)),
      options_(options),
      state_(nodes_.size()) {
  BRIGADE_CHECK(options_.window >= 1 && options_.first_window >= 1 && options_.confirm >= 1 &&
                options_.recover_ratio <= options_.ratio);
}

std::vector<StragglerEvent> StragglerDetector::observe(int64_t step, const std::vector<double>& ms,
                                                       const std::vector<double>& runqueue_ms) {
  BRIGADE_CHECK(ms.size() == nodes_.size(), "{} times for {} ranks", ms.size(), nodes_.size());
  BRIGADE_CHECK(runqueue_ms.empty() || runqueue_ms.size() == ms.size());
  std::vector<StragglerEvent> events;
  // One rank has no peers to be slower than.
  if (nodes_.size() < 2) return events;
  if (history_.empty()) first_step_ = step;
  history_.push_back(ms);
  runqueue_.push_back(runqueue_ms.empty() ? std::vector<double>(ms.size(), 0.0) : runqueue_ms);
  if (static_cast<int64_t>(history_.size()) > options_.window) {
    history_.pop_front();
    runqueue_.pop_front();
    ++first_step_;
  }
  if (static_cast<int64_t>(history_.size()) < std::min(options_.first_window, options_.window)) {
    return events;
  }
  const size_t n = nodes_.size();
  // Each rank's median over the window of its times less its waits for a
  // core (what its own speed decides), and of those waits.
  std::vector<double> on_cpu(n), waits(n);
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> mine, mine_waits;
    for (size_t k = 0; k < history_.size(); ++k) {
      mine.push_back(std::max(0.0, history_[k][r] - runqueue_[k][r]));
      mine_waits.push_back(runqueue_[k][r]);
    }
    on_cpu[r] = median(std::move(mine));
    waits[r] = median(std::move(mine_waits));
  }
  std::vector<double> sorted = on_cpu;
  std::sort(sorted.begin(), sorted.end());
  for (size_t r = 0; r < n; ++r) {
    const double base = median_without(sorted, on_cpu[r]);
    const double ratio = base > 0 ? on_cpu[r] / base : 0.0;
    const bool excess = on_cpu[r] - base >= options_.min_excess_ms;
    RankState& s = state_[r];
    // Past the threshold that would end the current state.
    const bool flipping =
        s.slow ? !(excess && ratio >= options_.recover_ratio) : excess && ratio > options_.ratio;
    s.streak = flipping ? s.streak + 1 : 0;
    if (s.streak < options_.confirm) continue;
    s.slow = !s.slow;
    s.streak = 0;
    events.push_back({s.slow, static_cast<int>(r), nodes_[r], ratio, on_cpu[r], base, waits[r],
                      first_step_, step, section_});
  }
  return events;
}

}  // namespace brigade

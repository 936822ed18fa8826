#include "brigade/train/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "brigade/core/error.h"

namespace brigade {
namespace {

// The k-th lowest of `v` (0-based; the highest when k is past the end).
double kth_lowest(std::vector<double> v, size_t k) {
  k = std::min(k, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

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
        "straggler: rank {} (node {}) {} {:.1f}x slower than its peers over steps {}-{} "
        "(section: {}; {:.2f} ms on a core against their {:.2f} ms; {:.0f}% of its {:.2f} ms "
        "waiting for a core)",
        rank, node, verb, ratio, first_step, last_step, section, on_cpu_ms, peers_on_cpu_ms,
        compute_ms > 0 ? 100.0 * runqueue_ms / compute_ms : 0.0, compute_ms);
  }
  return fmt::format(
      "straggler: rank {} (node {}) is no longer slow over steps {}-{} ({:.1f}x its peers, "
      "section: {})",
      rank, node, first_step, last_step, ratio, section);
}

StragglerDetector::StragglerDetector(std::string section, std::vector<int> nodes,
                                     std::vector<int> peer_groups, StragglerOptions options)
    : section_(std::move(section)),
      nodes_(std::move(nodes)),
      options_(options),
      state_(nodes_.size()) {
  BRIGADE_CHECK(options_.window >= 1 && options_.first_window >= 1 && options_.confirm >= 1 &&
                options_.low_rank >= 0 && options_.recover_ratio <= options_.ratio);
  if (peer_groups.empty()) peer_groups.assign(nodes_.size(), 0);
  BRIGADE_CHECK(peer_groups.size() == nodes_.size(), "{} peer groups for {} ranks",
                peer_groups.size(), nodes_.size());
  // Dense group numbers, in order of first appearance.
  std::vector<int> seen;
  for (size_t r = 0; r < peer_groups.size(); ++r) {
    const auto at = std::find(seen.begin(), seen.end(), peer_groups[r]);
    const auto g = static_cast<size_t>(at - seen.begin());
    if (at == seen.end()) {
      seen.push_back(peer_groups[r]);
      members_.emplace_back();
    }
    groups_.push_back(static_cast<int>(g));
    members_[g].push_back(r);
  }
}

std::vector<int> StragglerDetector::unpeered() const {
  std::vector<int> alone;
  for (size_t r = 0; r < groups_.size(); ++r) {
    if (members_[static_cast<size_t>(groups_[r])].size() < 2) alone.push_back(static_cast<int>(r));
  }
  return alone;
}

std::vector<StragglerEvent> StragglerDetector::observe(int64_t step, const std::vector<double>& ms,
                                                       const std::vector<double>& runqueue_ms) {
  BRIGADE_CHECK(ms.size() == nodes_.size(), "{} times for {} ranks", ms.size(), nodes_.size());
  BRIGADE_CHECK(runqueue_ms.empty() || runqueue_ms.size() == ms.size());
  std::vector<StragglerEvent> events;
  // No rank has peers to be slower than.
  if (members_.size() == nodes_.size()) return events;
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
  // Each rank's low quantile over the window of its times less its waits
  // for a core (what its own speed decides), and the medians of its times
  // and waits (for the line).
  const size_t k = static_cast<int64_t>(history_.size()) < options_.window
                       ? 0
                       : static_cast<size_t>(options_.low_rank);
  std::vector<double> on_cpu(n), walls(n), waits(n);
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> mine, mine_walls, mine_waits;
    for (size_t s = 0; s < history_.size(); ++s) {
      mine.push_back(std::max(0.0, history_[s][r] - runqueue_[s][r]));
      mine_walls.push_back(history_[s][r]);
      mine_waits.push_back(runqueue_[s][r]);
    }
    on_cpu[r] = kth_lowest(std::move(mine), k);
    walls[r] = median(std::move(mine_walls));
    waits[r] = median(std::move(mine_waits));
  }
  // Each group's scores, sorted once: the peers' median of a rank is its
  // group's without it.
  std::vector<std::vector<double>> sorted(members_.size());
  for (size_t g = 0; g < members_.size(); ++g) {
    for (size_t r : members_[g]) sorted[g].push_back(on_cpu[r]);
    std::sort(sorted[g].begin(), sorted[g].end());
  }
  for (size_t r = 0; r < n; ++r) {
    const std::vector<double>& peers = sorted[static_cast<size_t>(groups_[r])];
    if (peers.size() < 2) continue;
    const double base = median_without(peers, on_cpu[r]);
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
    events.push_back({s.slow, static_cast<int>(r), nodes_[r], ratio, on_cpu[r], base, walls[r],
                      waits[r], first_step_, step, section_});
  }
  return events;
}

}  // namespace brigade

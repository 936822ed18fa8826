#include "brigade/train/rank_stats.h"

#include <cstdlib>
#include <string>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"

namespace brigade {
namespace {

// A rank's numbers in the gathered vector: the breakdown, then these.
constexpr int kRss = StepBreakdown::kVectorSize;
constexpr int kBubble = kRss + 1;
constexpr int kPerRank = kBubble + 1;

std::vector<int> gather_nodes(Communicator* world, int node) {
  if (world == nullptr || world->size() == 1) return {node};
  std::vector<double> all(static_cast<size_t>(world->size()));
  const double mine = node;
  world->all_gather(&mine, all.data(), 1, DType::kF64)->wait();
  std::vector<int> nodes;
  for (double n : all) nodes.push_back(static_cast<int>(n));
  return nodes;
}

}  // namespace

int node_from_environment() {
  const char* value = std::getenv("GROUP_RANK");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long node = std::strtol(value, &end, 10);
  if (*end != '\0' || node < 0) {
    throw_error("GROUP_RANK='{}' is not a node index (>= 0): brigade launch sets it; unset it",
                value);
  }
  return static_cast<int>(node);
}

RankStats::RankStats(Communicator* world, int node, StragglerOptions options)
    : world_(world), nodes_(gather_nodes(world, node)), detector_("compute", nodes_, options) {}

RankStepStats RankStats::gather(int64_t step, const StepBreakdown& mine, double peak_rss_bytes,
                                double bubble_ms) {
  std::vector<double> local = mine.to_vector();
  local.push_back(peak_rss_bytes);
  local.push_back(bubble_ms);
  const size_t ranks = nodes_.size();
  std::vector<double> all(ranks * kPerRank);
  if (world_ != nullptr && world_->size() > 1) {
    world_->all_gather(local.data(), all.data(), kPerRank, DType::kF64)->wait();
  } else {
    all = local;
  }
  RankStepStats out;
  std::vector<double> compute, runqueue;
  for (size_t r = 0; r < ranks; ++r) {
    const double* v = all.data() + r * kPerRank;
    out.breakdown.push_back(StepBreakdown::from_vector(v));
    out.peak_rss_bytes.push_back(v[kRss]);
    out.bubble_ms.push_back(v[kBubble]);
    compute.push_back(out.breakdown.back()[StepPart::kCompute]);
    runqueue.push_back(out.breakdown.back().compute_runqueue_ms);
  }
  // Only the rank that reports needs them.
  if (world_ == nullptr || world_->rank() == 0)
    out.stragglers = detector_.observe(step, compute, runqueue);
  return out;
}

}  // namespace brigade

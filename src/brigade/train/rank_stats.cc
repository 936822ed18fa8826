#include "brigade/train/rank_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"

namespace brigade {
namespace {

// A rank's numbers in the gathered vector: the breakdown, then these.
constexpr int kRss = StepBreakdown::kVectorSize;
constexpr int kBubble = kRss + 1;
constexpr int kCheckpointState = kBubble + 1;
constexpr int kSnapshotState = kCheckpointState + 1;
constexpr int kStopSignal = kSnapshotState + 1;
constexpr int kPerRank = kStopSignal + 1;

// Each rank's node, pipeline stage and whether its clock counts the wait
// for a core, in world rank order.
constexpr int kStartFields = 3;
std::vector<double> gather_start(Communicator* world, int node, int stage, bool counts_runqueue) {
  const std::vector<double> mine = {static_cast<double>(node), static_cast<double>(stage),
                                    counts_runqueue ? 1.0 : 0.0};
  if (world == nullptr || world->size() == 1) return mine;
  std::vector<double> all(static_cast<size_t>(world->size()) * kStartFields);
  world->all_gather(mine.data(), all.data(), kStartFields, DType::kF64)->wait();
  return all;
}

std::vector<int> field(const std::vector<double>& ranks, int at) {
  std::vector<int> out;
  for (size_t r = 0; r < ranks.size() / kStartFields; ++r) {
    out.push_back(static_cast<int>(ranks[r * kStartFields + static_cast<size_t>(at)]));
  }
  return out;
}

std::string list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

int node_from_environment() {
  // BRIGADE_NODE first: GROUP_RANK is renumbered when the job goes on with
  // fewer nodes; a launcher other than brigade's sets only GROUP_RANK.
  for (const char* name : {"BRIGADE_NODE", "GROUP_RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long node = std::strtol(value, &end, 10);
    if (*end != '\0' || node < 0) {
      throw_error("{}='{}' is not a node index (>= 0): brigade launch sets it; unset it", name,
                  value);
    }
    return static_cast<int>(node);
  }
  return 0;
}

RankStats::RankStats(Communicator* world, int node, int stage, bool counts_runqueue,
                     StragglerOptions options)
    : RankStats(world, gather_start(world, node, stage, counts_runqueue), options) {}

RankStats::RankStats(Communicator* world, const std::vector<double>& ranks,
                     StragglerOptions options)
    : world_(world),
      nodes_(field(ranks, 0)),
      detector_("compute", nodes_, field(ranks, 1), options) {
  if (nodes_.size() < 2) return;
  const std::vector<int> stages = field(ranks, 1);
  const std::vector<int> alone = detector_.unpeered();
  if (!alone.empty()) {
    std::vector<int> alone_stages;
    for (int r : alone) alone_stages.push_back(stages[static_cast<size_t>(r)]);
    notes_.push_back(fmt::format(
        "brigade train: no straggler check for rank{} {} (pipeline stage{} {}): a rank is "
        "compared only with the ranks of its stage, and {} none; run with dp or tp > 1 to check "
        "them",
        alone.size() > 1 ? "s" : "", list(alone), alone_stages.size() > 1 ? "s" : "",
        list(alone_stages), alone.size() > 1 ? "these have" : "it has"));
  }
  std::vector<int> uncounted;
  const std::vector<int> counted = field(ranks, 2);
  for (size_t r = 0; r < counted.size(); ++r) {
    if (counted[r] == 0) uncounted.push_back(static_cast<int>(r));
  }
  if (!uncounted.empty()) {
    notes_.push_back(fmt::format(
        "brigade train: /proc/thread-self/schedstat is missing or reads zeros (the kernel's "
        "scheduler accounting is off) on rank{} {}: straggler scores there count the wait for a "
        "core as compute, so a rank starved by other processes can be named",
        uncounted.size() > 1 ? "s" : "", list(uncounted)));
  }
}

RankStepStats RankStats::gather(int64_t step, const StepBreakdown& mine, double peak_rss_bytes,
                                double bubble_ms, SaveStates saves, int stop_signal,
                                GatherFault fault) {
  std::vector<double> local = mine.to_vector();
  local.push_back(peak_rss_bytes);
  local.push_back(bubble_ms);
  local.push_back(saves.checkpoint);
  local.push_back(saves.snapshot);
  local.push_back(stop_signal);
  const size_t ranks = nodes_.size();
  std::vector<double> all(ranks * kPerRank);
  if (world_ != nullptr && world_->size() > 1 && fault != GatherFault::kSkip) {
    if (fault == GatherFault::kMismatch) {
      // Room for what a backend that does not check the count would write.
      local.push_back(0.0);
      all.resize(ranks * (kPerRank + 1));
    }
    world_->all_gather(local.data(), all.data(), static_cast<int64_t>(local.size()), DType::kF64)
        ->wait();
  } else {
    all.clear();
    for (size_t r = 0; r < ranks; ++r) all.insert(all.end(), local.begin(), local.end());
  }
  RankStepStats out;
  std::vector<double> compute, runqueue;
  for (size_t r = 0; r < ranks; ++r) {
    const double* v = all.data() + r * kPerRank;
    out.breakdown.push_back(StepBreakdown::from_vector(v));
    out.peak_rss_bytes.push_back(v[kRss]);
    out.bubble_ms.push_back(v[kBubble]);
    out.checkpoint_states.push_back(static_cast<int32_t>(v[kCheckpointState]));
    out.snapshot_states.push_back(static_cast<int32_t>(v[kSnapshotState]));
    out.stop_signal = std::max(out.stop_signal, static_cast<int>(v[kStopSignal]));
    compute.push_back(out.breakdown.back()[StepPart::kCompute]);
    runqueue.push_back(out.breakdown.back().compute_runqueue_ms);
  }
  // Only the rank that reports needs them.
  if (world_ == nullptr || world_->rank() == 0)
    out.stragglers = detector_.observe(step, compute, runqueue);
  return out;
}

}  // namespace brigade

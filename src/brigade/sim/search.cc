#include "brigade/sim/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

namespace brigade::sim {

const char* loss_reason_name(LossReason r) {
  switch (r) {
    case LossReason::kOutOfMemory:
      return "out of memory";
    case LossReason::kCompute:
      return "compute (recompute, small GEMMs, unsplit work)";
    case LossReason::kTpComm:
      return "tensor-parallel communication";
    case LossReason::kPpComm:
      return "pipeline transfers";
    case LossReason::kDpComm:
      return "data-parallel communication";
    case LossReason::kBubble:
      return "pipeline bubble";
    case LossReason::kOptimizer:
      return "optimizer step";
    case LossReason::kTie:
      return "as fast, more memory";
  }
  return "?";
}

LossReason loss_reason(const Estimate& winner, const Estimate& loser) {
  const TimeEstimate& w = winner.time;
  const TimeEstimate& l = loser.time;
  const std::array<std::pair<double, LossReason>, 6> excess = {{
      {l.compute_s - w.compute_s, LossReason::kCompute},
      {l.tp_comm_s - w.tp_comm_s, LossReason::kTpComm},
      {l.pp_comm_s - w.pp_comm_s, LossReason::kPpComm},
      {l.dp_exposed_s - w.dp_exposed_s, LossReason::kDpComm},
      {l.bubble_s - w.bubble_s, LossReason::kBubble},
      {l.optimizer_s - w.optimizer_s, LossReason::kOptimizer},
  }};
  const auto worst = std::max_element(excess.begin(), excess.end());
  return worst->first > 1e-12 * w.step_s() ? worst->second : LossReason::kTie;
}

namespace {

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n && i <= limit; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

template <typename T>
std::vector<T> pinned_or(const std::optional<T>& pin, std::vector<T> all) {
  if (pin) return {*pin};
  return all;
}

// Faster first; between equally fast layouts, the one that needs less memory.
bool faster(const Estimate& a, const Estimate& b) {
  if (a.time.step_s() != b.time.step_s()) return a.time.step_s() < b.time.step_s();
  return a.memory.total() < b.memory.total();
}

// The schedules worth trying: one stage runs 1F1B (plain gradient
// accumulation, one micro-batch alive); virtual stages mean interleaved;
// otherwise each single-chunk schedule the software runs, or the pinned one
// (which estimate() refuses, with its reason, where it cannot run).
std::vector<schedule::Kind> schedules_for(const Workload& job, const LayoutPins& pins, int64_t pp,
                                          int64_t vp) {
  using schedule::Kind;
  if (pp == 1) return {Kind::kOneFOneB};
  if (pins.schedule) return {*pins.schedule};
  if (vp > 1) return {Kind::kInterleaved};
  std::vector<Kind> kinds;
  for (Kind k : {Kind::kOneFOneB, Kind::kZbH1, Kind::kGpipe}) {
    if (std::find(job.features.schedules.begin(), job.features.schedules.end(), k) !=
        job.features.schedules.end()) {
      kinds.push_back(k);
    }
  }
  return kinds;
}

}  // namespace

SearchResult search_layouts(const Workload& job, int64_t gpus, const Hardware& hw,
                            const LayoutPins& pins, size_t keep) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  std::vector<Estimate> fitting, oom;
  std::map<std::string, int64_t> invalid_reasons;
  const std::vector<int64_t> tps = pinned_or(pins.tp, divisors(hw.gpus_per_node, hw.gpus_per_node));
  const std::vector<int64_t> pps = pinned_or(pins.pp, divisors(job.model.n_layer, gpus));
  std::vector<PlanRecompute> recomputes = {PlanRecompute::kNone, PlanRecompute::kFull};
  // With fused attention nothing is left for selective recompute to drop.
  if (!job.features.flash_attention) recomputes.push_back(PlanRecompute::kSelective);
  recomputes = pinned_or(pins.recompute, recomputes);
  const std::vector<int> zeros = pinned_or(pins.zero, std::vector<int>{0, 1, 2, 3});

  for (int64_t tp : tps) {
    for (int64_t pp : pps) {
      if (gpus % (tp * pp) != 0) continue;
      const int64_t dp = gpus / (tp * pp);
      if (job.global_batch % dp != 0) {
        ++result.invalid;
        ++invalid_reasons[fmt::format("global batch {} is not a multiple of dp={}",
                                      job.global_batch, dp)];
        continue;
      }
      const std::vector<int64_t> micros =
          pinned_or(pins.micro, divisors(job.global_batch / dp, pins.max_micro));
      const std::vector<int64_t> vps = pinned_or(
          pins.vp, pp == 1 ? std::vector<int64_t>{1} : divisors(job.model.n_layer / pp, 64));
      const std::vector<bool> sps =
          pinned_or(pins.sp, tp == 1 ? std::vector<bool>{false} : std::vector<bool>{false, true});
      // Without data parallelism every ZeRO stage is ZeRO 0.
      const std::vector<int> dp_zeros = dp == 1 && !pins.zero ? std::vector<int>{0} : zeros;
      for (int64_t micro : micros) {
        for (int64_t vp : vps) {
          for (schedule::Kind kind : schedules_for(job, pins, pp, vp)) {
            for (int zero : dp_zeros) {
              for (PlanRecompute recompute : recomputes) {
                for (bool sp : sps) {
                  Layout l{tp, pp, dp, vp, zero, recompute, sp, micro, kind};
                  Estimate e = estimate(job, l, hw);
                  if (!e.valid) {
                    ++result.invalid;
                    ++invalid_reasons[e.invalid];
                    continue;
                  }
                  ++result.evaluated;
                  (e.fits ? fitting : oom).push_back(std::move(e));
                }
              }
            }
          }
        }
      }
    }
  }
  result.fitting = static_cast<int64_t>(fitting.size());
  if (!invalid_reasons.empty()) {
    result.common_invalid =
        std::max_element(invalid_reasons.begin(), invalid_reasons.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; })
            ->first;
  }
  std::sort(fitting.begin(), fitting.end(), faster);

  std::vector<LossGroup> groups;
  auto group_for = [&groups](LossReason r) -> LossGroup& {
    for (LossGroup& g : groups) {
      if (g.reason == r) return g;
    }
    groups.push_back(LossGroup{r, 0, {}});
    return groups.back();
  };
  for (size_t i = 1; i < fitting.size(); ++i) {
    LossGroup& g = group_for(loss_reason(fitting[0], fitting[i]));
    if (g.count++ == 0) g.best = fitting[i];  // sorted: the first is the fastest
  }
  if (!oom.empty()) {
    // The OOM layout that would have been fastest had it fit.
    LossGroup& g = group_for(LossReason::kOutOfMemory);
    g.count = static_cast<int64_t>(oom.size());
    g.best = *std::min_element(oom.begin(), oom.end(), faster);
  }
  std::sort(groups.begin(), groups.end(),
            [](const LossGroup& a, const LossGroup& b) { return a.count > b.count; });
  result.losses = std::move(groups);
  if (fitting.size() > keep) fitting.resize(keep);
  result.ranked = std::move(fitting);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace brigade::sim

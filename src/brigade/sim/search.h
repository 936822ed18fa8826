// Configuration search: every layout of a job on N GPUs, estimated, ranked,
// and the losers grouped by what beat them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "brigade/sim/cost_model.h"

namespace brigade::sim {

// Dimensions the caller fixes; the search varies the rest.
struct LayoutPins {
  std::optional<int64_t> tp, pp, vp, micro;
  std::optional<int> zero;
  std::optional<PlanRecompute> recompute;
  std::optional<bool> sp;
  std::optional<schedule::Kind> schedule;  // with pp > 1
  int64_t max_micro = 64;
};

// Why a layout lost to the winner: the step-time component it spends the
// most extra time on, or memory.
enum class LossReason {
  kOutOfMemory,
  kCompute,  // recompute, or GEMMs too small to run fast
  kTpComm,
  kPpComm,
  kDpComm,
  kBubble,
  kOptimizer,
  kTie,  // as fast as the winner; lost on memory
};
const char* loss_reason_name(LossReason r);

struct LossGroup {
  LossReason reason;
  int64_t count = 0;
  Estimate best;  // the fastest layout that lost for this reason
};

struct SearchResult {
  std::vector<Estimate> ranked;   // layouts that fit, fastest first (at most `keep`)
  std::vector<LossGroup> losses;  // by reason, largest group first
  int64_t evaluated = 0;          // layouts estimated (valid ones)
  int64_t invalid = 0;            // combinations that cannot run (sizes do not divide, ...)
  std::string common_invalid;     // the reason most of them cannot
  int64_t fitting = 0;
  double seconds = 0;  // wall time of the search
};

SearchResult search_layouts(const Workload& job, int64_t gpus, const Hardware& hw,
                            const LayoutPins& pins = {}, size_t keep = 5);

// Which component made `loser` slower than `winner` (both must fit).
LossReason loss_reason(const Estimate& winner, const Estimate& loser);

}  // namespace brigade::sim

// Runs every stage's instruction list together under given costs, without
// processes: the timeline of each stage, the step time, the bubble and the
// activation memory a schedule implies. The tests check schedules with it
// and the planner (sim/) takes its bubble from it.
//
// The model: each stage runs its list in order on one clock. Compute
// instructions take their cost; a send costs the sender nothing (it is
// asynchronous) and its data reaches the receiver p2p_s later; a receive
// waits until that data is there. Links have no capacity limit, so two
// transfers never slow each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/schedule/schedule.h"

namespace brigade::schedule {

// Seconds per micro-batch for a stage's whole share of the model, all its
// chunks together: a chunk's instruction takes 1/v of it, where v is the
// number of chunks the lists use. A fused kBackward costs backward_input +
// backward_weight.
struct StageCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

struct Costs {
  std::vector<StageCosts> stages = {StageCosts{}};  // one per stage, or one for all
  double p2p_s = 0;                                 // from a send to its data being at the receiver
  double optimizer_s = 0;                           // the optimizer step at the end of every list
};

struct Interval {
  Instruction instruction;
  double start = 0, end = 0;  // for a receive: from asking to having the data
};

struct StageTimeline {
  std::vector<Interval> intervals;  // empty unless asked for
  double busy_s = 0;                // computing (optimizer step included)
  double finish_s = 0;              // when its last instruction ended
  double bubble_s = 0;              // step_s - busy_s: idle at any point of the step
  double bubble_fraction = 0;       // bubble_s / step_s
  // Most (micro-batch, chunk) pairs whose forward has run and whose weight
  // gradient (kBackwardWeight or kBackward) has not: the activations kept.
  int64_t peak_live = 0;
  double peak_live_microbatches = 0;  // peak_live / v: in whole stages' worth
};

struct Simulation {
  bool ok = true;
  // When !ok: a deadlock (every unfinished stage and what it waits for), a
  // send whose peer is not the stage holding the next virtual stage, the
  // same data sent twice, or data sent and never received.
  std::string problem;
  std::vector<StageTimeline> stages;
  double step_s = 0;  // the last stage to finish
};

// `lists[s]` is stage s's list (as all_stage_instructions gives).
// `costs.stages` has one entry per stage or one for all. Never hangs.
Simulation simulate(const std::vector<std::vector<Instruction>>& lists, const Costs& costs,
                    bool keep_intervals = true);

}  // namespace brigade::schedule

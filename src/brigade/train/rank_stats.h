// What every rank's step says, brought to every rank once per step by one
// small all-gather on the world group: its step-time breakdown
// (train/step_breakdown.h), peak RSS and pipeline bubble, with the ranks'
// nodes, pipeline stages (a rank's straggler peers are those of its
// stage) and whether their clocks count the wait for a core learnt once. From it world rank 0
// writes the per-rank metrics, and the straggler detector (train/straggler.h) runs on the compute
// section.
//
// Why every step and every rank: the detector needs each step's compute
// times (a straggler named within 20 steps), and the vector is 16 doubles a
// rank, the cost of any one of the small collectives it replaces (the RSS
// and bubble gathers, the saves' polls, the stop agreement).
//
// It is also the training loop's one collective between two steps (a
// save's start costs none once the previous save settled,
// docs/ARCHITECTURE.md "Between two steps"): it
// carries where each rank's background saves stand (the states
// train/checkpoint_saver.h exchanges to agree on a save's outcome) and the
// stop signal each rank was sent, so the ranks agree on both without a
// collective of their own. Across nodes each collective is a network round
// trip and a point where the ranks' drift on shared cores is absorbed
// (docs/PERFORMANCE.md, issue 14).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/train/step_breakdown.h"
#include "brigade/train/straggler.h"

namespace brigade {

class Communicator;

struct RankStepStats {
  std::vector<StepBreakdown> breakdown;  // by world rank
  std::vector<double> peak_rss_bytes;
  std::vector<double> bubble_ms;  // the pipeline's measured bubble (StepMetrics::bubble_ms)
  // Episodes that started or ended with this step (world rank 0 only: the
  // detector's medians cost about 1 us a rank a step).
  std::vector<StragglerEvent> stragglers;
  // Every rank's SaveStates, by world rank (CheckpointSaver::poll's input).
  std::vector<int32_t> checkpoint_states;
  std::vector<int32_t> snapshot_states;
  // The highest stop signal any rank was sent (0: none). Every rank gets
  // the same value from the same gather, so all stop after the same step.
  int stop_signal = 0;
};

// This rank's writer states (AsyncCheckpointWriter::State) of its disk
// checkpoint's and its snapshot's saves, read just before the gather.
struct SaveStates {
  int32_t checkpoint = 0;
  int32_t snapshot = 0;
};

// An injected bug on this rank's next gather (elastic/fault_injection.h,
// skip and mismatch, which diag/root_cause.h must tell apart): left out
// (the rank goes on as if every rank had sent its own numbers), or called
// with one number more than the others.
enum class GatherFault { kNone, kSkip, kMismatch };

class RankStats {
 public:
  // Collective over `world` (null: this process alone): gathers the ranks'
  // nodes, stages and clocks. node: this rank's
  // (node_from_environment()); stage: its pipeline stage (0 without a pipeline);
  // counts_runqueue: its StepClock's.
  RankStats(Communicator* world, int node, int stage, bool counts_runqueue,
            StragglerOptions options = {});

  // Collective: every rank's numbers of 1-based step `step`. stop_signal:
  // the signal this rank was sent (0: none).
  RankStepStats gather(int64_t step, const StepBreakdown& mine, double peak_rss_bytes,
                       double bubble_ms, SaveStates saves = {}, int stop_signal = 0,
                       GatherFault fault = GatherFault::kNone);

  const std::vector<int>& nodes() const { return nodes_; }
  // What people should know once, at the start, about the straggler check:
  // the stages it cannot check (a rank alone in its stage has no peers),
  // and ranks whose compute counts their wait for a core (no schedstat).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  RankStats(Communicator* world, const std::vector<double>& ranks, StragglerOptions options);

  Communicator* world_;
  std::vector<int> nodes_;
  std::vector<std::string> notes_;
  StragglerDetector detector_;
};

// This process's node under a launcher: BRIGADE_NODE (its rank as the job
// started, as incidents name it), else GROUP_RANK; 0 without either.
int node_from_environment();

}  // namespace brigade

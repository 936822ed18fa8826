// Straggler detection from every rank's per-step section times.
//
// In a synchronous job a slow rank's step time is everyone's (the others
// wait for it in the next collective), so step times cannot tell who is
// slow; the compute section can: the slow rank computes longer and the
// others wait longer (their comm section). Each step every rank's compute
// milliseconds reach world rank 0 (one small all-gather it already makes
// for the metrics), which feeds them here.
//
// A rank's score is the median of its last `window` steps' compute times,
// each less the time the kernel kept the rank runnable but off every core
// (its run-queue wait, train/step_breakdown.h), over the median of the
// other ranks' scores. Less the wait: a rank that only waits longer for a
// core is starved by other processes on its machine, not slow itself (on
// this project's loaded 2-core machine that wait alone made a clean rank
// 2.9x "slower" in wall time for 30 steps, and a starved fast rank hid an
// injected 2x one). The wait's median goes into the line, for people to
// see how busy the rank's machine is. Medians, not means: a rank
// descheduled now and then for a time slice moves a mean but not a median
// until it hits most of the window. An episode starts when a score stays
// above `ratio` for `confirm` steps in a row, and ends when it stays below
// `recover_ratio` for `confirm` steps (hysteresis: a rank near the
// threshold is reported once, not on every crossing).
//
// The numbers, from 2,900 clean steps of dp 2 with ~10 ms steps and 34
// injected 2x runs on the loaded machine (load average 7-10 from other
// builds): the highest score a clean rank held for 9 steps in a row was
// 1.44 in the runs measured and 1.7 once in a test; every injected rank
// held 2.1 or more (up to 4.1) within its first 20 steps, but on a quiet
// machine a 2x rank scores just 2.0 (its extra time is exactly its own
// compute), and 1.8 missed one for 39 steps. So `ratio` = 1.6, between the
// two (the 1.5 alarmed on that clean 1.7 once in ~10 runs of 100
// steps; 1.6 lowers that chance but does not rule it out on a machine this
// loaded), and `confirm` = 9: a rank
// slow from the start is named at step first_window + confirm - 1 = 13,
// one that slows later window / 2 + confirm - 1 = 13 steps after it did,
// within the 20. A rank 1.5x slower is not named. Not clean by
// this measure: steps under ~1 ms (the tiny test model), where a vCPU's
// stolen time shows as compute (a clean rank of dp 2 held 2.4); and ranks
// that share a core (3 ranks on 2 cores), each slower in turn for hundreds
// of steps.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace brigade {

struct StragglerOptions {
  int64_t window = 10;
  // Scores start once this many steps are in (the window then fills up to
  // `window`): a rank slow from the start is named sooner.
  int64_t first_window = 5;
  double ratio = 1.6;          // a rank this many times the others' median is slow
  double recover_ratio = 1.3;  // and is back once below this
  int64_t confirm = 9;         // steps in a row either way
  // Below this many ms of excess over the others no rank is slow: a
  // section of microseconds has ratios of pure noise.
  double min_excess_ms = 0.05;
};

struct StragglerEvent {
  bool started = true;  // false: the rank recovered, the episode ended
  int rank = 0;
  int node = 0;
  double ratio = 0;      // the rank's median over the others'
  double median_ms = 0;  // the rank's median over the window
  double others_median_ms = 0;
  double runqueue_ms = 0;  // the rank's median wait for a core within compute
  int64_t first_step = 0;  // the window, 1-based steps
  int64_t last_step = 0;
  std::string section;

  // "straggler: rank 2 (node 0) computes 2.1x slower than the median rank
  // over steps 31-40 (section: compute)", or "... is no longer slower ..."
  std::string line() const;
};

class StragglerDetector {
 public:
  // section: the name of the part the times are of ("compute"); nodes: each
  // rank's node (GROUP_RANK), as many as ranks.
  StragglerDetector(std::string section, std::vector<int> nodes, StragglerOptions options = {});

  // The times of 1-based step `step`, one per rank (and of them, each
  // rank's wait for a core; may be empty); returns the episodes that
  // started or ended with it.
  std::vector<StragglerEvent> observe(int64_t step, const std::vector<double>& ms,
                                      const std::vector<double>& runqueue_ms = {});

  int ranks() const { return static_cast<int>(nodes_.size()); }
  bool in_episode(int rank) const { return state_[static_cast<size_t>(rank)].slow; }

 private:
  struct RankState {
    bool slow = false;
    int64_t streak = 0;  // steps in a row past the threshold that would flip `slow`
  };
  std::string section_;
  std::vector<int> nodes_;
  StragglerOptions options_;
  std::deque<std::vector<double>> history_, runqueue_;
  int64_t first_step_ = 0;  // of history_.front()
  std::vector<RankState> state_;
};

}  // namespace brigade

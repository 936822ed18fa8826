// Straggler detection from every rank's per-step section times.
//
// In a synchronous job a slow rank's step time is everyone's (the others
// wait for it in the next collective), so step times cannot tell who is
// slow; the compute section can: the slow rank computes longer and the
// others wait longer (their comm section). Each step every rank's compute
// milliseconds reach world rank 0 (one small all-gather it already makes
// for the metrics), which feeds them here.
//
// A rank's score is the median of its last `window` steps' compute times
// over the median of the other ranks' medians over the same window.
// Medians, not means: on a loaded machine a rank is descheduled now and
// then for a whole time slice (4 ms and more, several times a small step),
// which moves a mean but not a median until it hits most of the window. An
// episode starts when a score stays above `ratio` for `confirm` steps in a
// row, and ends when it stays below `recover_ratio` for `confirm` steps
// (hysteresis: a rank near the threshold is reported once, not on every
// crossing).
//
// The numbers, from clean and injected runs on this project's loaded
// 2-core machine (load average 7-8 from other builds): with steps of about
// 1 ms (the tiny test model) the scheduler alone pushes one rank of a clean
// dp 2 job past 1.5x for up to 8 steps in a row (up to 2.7x), with steps of
// about 10 ms never past 1.4x; an injected 2x rank scores 2-3.4x throughout.
// So `confirm` = 9 steps outlasts the noise (with the second condition
// below), and a rank slow from the
// start is named at step window + confirm - 1 = 18, one that slows later
// window / 2 + confirm - 1 = 13 steps after it did: within the 20.
// Oversubscribed ranks (3 ranks on 2 cores) are not clean: whichever
// shares a core is really slower, for hundreds of steps, and is named.
//
// A rank must be past the ratio twice: in its compute times, and in them
// less its run-queue wait (the time the kernel kept it runnable but off
// every core; train/step_breakdown.h). A rank that only waits for a core
// longer is starved by other processes on its machine, not slow itself;
// on the loaded 2-core machine that wait made a clean rank 2.9x "slower"
// for 30 steps. The wait's median goes into the line.
//
// With both conditions, on the runs above: no clean dp 2 rank (1 ms or 10
// ms steps) past 1.5x for more than 8 steps in a row, nor a clean dp 3 one
// with 10 ms steps (three ranks on two cores); an injected 2x rank past it
// throughout, named at step 18.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace brigade {

struct StragglerOptions {
  int64_t window = 10;
  double ratio = 1.5;           // a rank this many times the others' median is slow
  double recover_ratio = 1.25;  // and is back once below this
  int64_t confirm = 9;          // steps in a row either way
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

// Straggler detection from every rank's per-step section times.
//
// In a synchronous job a slow rank's step time is everyone's (the others
// wait for it in the next collective), so step times cannot tell who is
// slow; the compute section can: the slow rank computes longer and the
// others wait longer (their comm section). Each step every rank's compute
// milliseconds reach world rank 0 (one small all-gather it already makes
// for the metrics), which feeds them here.
//
// A rank is compared only with its peers: the ranks that do the same work,
// those of its pipeline stage (its data- and tensor-parallel peers). The
// stages of a pipeline do different work (the last one carries the LM
// head; stage_layers may be uneven), so against the median of all ranks a
// pipeline's heavier stage was named on every clean run. A rank alone in
// its stage (pp without dp or tp) has no peers and is not scored.
//
// A rank's score is a low quantile (the second-lowest of the last `window`
// steps) of its compute times, each less the time the kernel kept the rank
// runnable but off every core (its run-queue wait, train/step_breakdown.h),
// over the median of its peers' scores. Less the wait: a rank that only
// waits longer for a core is starved by other processes on its machine,
// not slow itself (on this project's loaded 2-core machine that wait alone
// made a clean rank 2.9x "slower" in wall time for 30 steps, and a starved
// fast rank hid an injected 2x one). A low quantile, not the median:
// interference (a time slice lost, a cache flushed by a neighbour, a page
// fault) only ever adds time, and a clean rank is at its own speed in most
// steps, while a slow rank is slow in every step; the median let a clean
// rank held back in half the steps of a loaded machine score 1.7 for 9
// steps (against a 1.6 threshold). The wait's share of the rank's compute
// goes into the line, for people to see how busy the rank's machine is.
// An episode starts when a score stays above `ratio` for `confirm` steps in
// a row, and ends when it stays below `recover_ratio` for `confirm` steps
// (hysteresis: a rank near the threshold is reported once, not on every
// crossing).
//
// The numbers: on the loaded machine (load average 7-10 from other builds)
// with ~10 ms steps, every injected 2x rank held 2.1 or more within its
// first 20 steps, but on a quiet machine a 2x rank scores just 2.0 (its
// extra time is exactly its own compute), and 1.8 missed one for 39 steps.
// So `ratio` = 1.6, and `confirm` = 9: a rank slow from the start is named
// at step first_window + confirm - 1 = 13; one that slows later once all but
// one of its window's steps are slow (window - 2 steps after it did), then
// confirm - 1 steps on: 16 steps after, within the 20. A rank 1.5x
// slower is not named. Not clean by this measure: steps under ~1 ms (the
// tiny test model), where a vCPU's stolen time shows as compute; and ranks
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
  // The score is the (low_rank + 1)-th lowest of the window's times (the
  // lowest while fewer are in).
  int64_t low_rank = 1;
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
  double ratio = 0;            // the rank's score over its peers' median score
  double on_cpu_ms = 0;        // the rank's score: a low quantile of its compute less its waits
  double peers_on_cpu_ms = 0;  // its peers' median score
  double compute_ms = 0;       // the rank's median compute over the window (wall time)
  double runqueue_ms = 0;      // the rank's median wait for a core within compute
  int64_t first_step = 0;      // the window, 1-based steps
  int64_t last_step = 0;
  std::string section;

  // "straggler: rank 2 (node 0) computes 2.1x slower than its peers over
  // steps 31-40 (section: compute; ...; 4% of its compute waiting for a
  // core)", or "... is no longer slow ..."
  std::string line() const;
};

class StragglerDetector {
 public:
  // section: the name of the part the times are of ("compute"); nodes: each
  // rank's node (a label: node_from_environment()), as many as ranks; peer_groups: each rank's
  // group of peers (its pipeline stage), as many as ranks, or empty: all
  // ranks are peers.
  StragglerDetector(std::string section, std::vector<int> nodes, std::vector<int> peer_groups = {},
                    StragglerOptions options = {});

  // The times of 1-based step `step`, one per rank (and of them, each
  // rank's wait for a core; may be empty); returns the episodes that
  // started or ended with it.
  std::vector<StragglerEvent> observe(int64_t step, const std::vector<double>& ms,
                                      const std::vector<double>& runqueue_ms = {});

  int ranks() const { return static_cast<int>(nodes_.size()); }
  // The ranks that have no peer and so are never named.
  std::vector<int> unpeered() const;
  bool in_episode(int rank) const { return state_[static_cast<size_t>(rank)].slow; }

 private:
  struct RankState {
    bool slow = false;
    int64_t streak = 0;  // steps in a row past the threshold that would flip `slow`
  };
  std::string section_;
  std::vector<int> nodes_;
  std::vector<int> groups_;                   // each rank's, 0-based and dense
  std::vector<std::vector<size_t>> members_;  // each group's ranks
  StragglerOptions options_;
  std::deque<std::vector<double>> history_, runqueue_;
  int64_t first_step_ = 0;  // of history_.front()
  std::vector<RankState> state_;
};

}  // namespace brigade

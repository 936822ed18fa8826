// Faults a worker raises on itself, for tests and demos of recovery:
//
//   kill:rank=1:step=5          rank 1 SIGKILLs itself right after step 5
//   stop:rank=2:step=8:gen=1    rank 2 SIGSTOPs itself after step 8, in generation 1
//   skip:rank=1:step=5          rank 1 leaves out the next collective after step 5
//                               (the loop's stop agreement on the world group)
//   mismatch:rank=1:step=5      rank 1 calls that collective with another count
//   slow:rank=2:factor=3        rank 2 takes 3x its compute time in every step
//   sdc:rank=1:step=5           rank 1 flips a bit of one of its parameters after
//                               step 5's update (silent data corruption, which
//                               diag.sdc_every's replica check must catch)
//   sdc:rank=1:step=5:when=forward  the same flip at the start of step 5's
//                               forward, while the snapshot of step 4 may be
//                               reading the parameters
//   sdc:rank=1:step=5:what=moment  the flip in an Adam moment instead
//   nan:rank=1:step=5[:times=2] rank 1's loss of step 5 is NaN, on its first
//                               computation only (a passing fault: the step's
//                               re-run is clean) or `times` of them (2: the re-run
//                               too, as bad data would)
//
// skip and mismatch are the bugs diag/root_cause.h tells apart: a rank that
// did not call a collective its group called, and one that called it with
// another shape. They act on the training loop's own collective, so the model
// code stays as it is; what follows is the communicator's to detect.
//
// Several are separated by commas. A fault belongs to one generation (0
// unless gen= says), so the restarted job does not raise it again. The
// worker stamps the time into its heartbeat slot first, which is how the
// agent measures how long detection took.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::elastic {

class WorkerHeartbeat;

struct InjectedFault {
  enum class Kind { kKill, kStop, kSkip, kMismatch, kSlow, kSdc, kNan } kind = Kind::kKill;
  int rank = 0;
  int64_t step = 0;  // after this step completes (counted from 1); slow: none
  int64_t generation = 0;
  int64_t factor = 1;       // slow: this many times the compute time
  int64_t times = 1;        // nan: how many of the step's loss computations are NaN
  bool in_forward = false;  // sdc: during step's forward, not after its update
  bool in_moment = false;   // sdc: in an Adam moment, not a parameter
};

// Throws Error naming the malformed part and the expected form.
std::vector<InjectedFault> parse_faults(std::string_view spec);

// The kill, stop, skip, mismatch or sdc (not when=forward) planned for
// `rank` right after `step` in `generation`, or null.
const InjectedFault* fault_after_step(const std::vector<InjectedFault>& faults, int rank,
                                      int64_t generation, int64_t step);

// The slow fault's factor for `rank` in `generation`: 1 when none.
int64_t slow_factor(const std::vector<InjectedFault>& faults, int rank, int64_t generation);

// The faults the trainer raises inside a step (nan, sdc with when=forward)
// planned for `rank` in `generation`.
std::vector<InjectedFault> in_step_faults(const std::vector<InjectedFault>& faults, int rank,
                                          int64_t generation);

// Says so on stderr, stamps the heartbeat (if any) and raises a kill or stop
// on this process. Returns only after a stop, once continued. A skip,
// mismatch or sdc is the caller's to carry out (it owns the collective, or
// the parameters); this only says so, and stamps an sdc (its detection time
// is the check's to show).
void raise_fault(const InjectedFault& fault, WorkerHeartbeat* heartbeat);

}  // namespace brigade::elastic

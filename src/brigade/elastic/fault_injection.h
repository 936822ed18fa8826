// Faults a worker raises on itself, for tests and demos of recovery:
//
//   kill:rank=1:step=5          rank 1 SIGKILLs itself right after step 5
//   stop:rank=2:step=8:gen=1    rank 2 SIGSTOPs itself after step 8, in generation 1
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
  enum class Kind { kKill, kStop } kind = Kind::kKill;
  int rank = 0;
  int64_t step = 0;  // after this step completes (counted from 1)
  int64_t generation = 0;
};

// Throws Error naming the malformed part and the expected form.
std::vector<InjectedFault> parse_faults(std::string_view spec);

// The fault planned for `rank` right after `step` in `generation`, or null.
const InjectedFault* fault_after_step(const std::vector<InjectedFault>& faults, int rank,
                                      int64_t generation, int64_t step);

// Says so on stderr, stamps the heartbeat (if any) and raises the fault on
// this process. Returns only after a stop, once continued.
void raise_fault(const InjectedFault& fault, WorkerHeartbeat* heartbeat);

}  // namespace brigade::elastic

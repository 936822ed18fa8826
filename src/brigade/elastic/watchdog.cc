#include "brigade/elastic/watchdog.h"

#include <fmt/format.h>

#include "brigade/core/clock.h"

namespace brigade::elastic {

std::optional<Stall> check_progress(const WorkerProgress& p, int64_t now_ns,
                                    const WatchdogOptions& options) {
  if (p.beat_ns == 0) return std::nullopt;
  const int64_t silent_ns = now_ns - p.beat_ns;
  if (silent_ns > options.heartbeat_timeout_ms * kNsPerMs) {
    return Stall{
        Stall::Kind::kSilent, p.beat_ns,
        fmt::format("sent no heartbeat for {:.1f} s (stopped or frozen)", silent_ns * 1e-9)};
  }
  // Set-up (before start_step) is bounded by the rendezvous timeouts of
  // the communicators, which end the worker with an error.
  if (p.start_step < 0) return std::nullopt;
  const int64_t progress_ns = p.step_ns;
  const int64_t stuck_ns = now_ns - progress_ns;
  if (stuck_ns > options.step_timeout_ms * kNsPerMs) {
    return Stall{Stall::Kind::kStuck, progress_ns,
                 fmt::format("completed no step for {:.1f} s after step {} (the step timeout is "
                             "{} s): stuck",
                             stuck_ns * 1e-9, p.step, options.step_timeout_ms / 1000.0)};
  }
  return std::nullopt;
}

}  // namespace brigade::elastic

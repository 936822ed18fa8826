#include "brigade/elastic/watchdog.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>

#include "brigade/core/clock.h"

namespace brigade::elastic {

std::optional<Stall> check_progress(const WorkerProgress& p, int64_t now_ns,
                                    const WatchdogOptions& options, bool stopped) {
  if (p.beat_ns == 0) return std::nullopt;
  const int64_t silent_ns = now_ns - p.beat_ns;
  if (stopped && silent_ns > options.stopped_after_ms * kNsPerMs) {
    return Stall{Stall::Kind::kSilent, p.beat_ns,
                 fmt::format("is stopped by a signal (state T; no heartbeat for {:.1f} s)",
                             silent_ns * 1e-9)};
  }
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

bool beat_is_late(const WorkerProgress& p, int64_t now_ns, const WatchdogOptions& options) {
  return p.beat_ns != 0 && now_ns - p.beat_ns > options.stopped_after_ms * kNsPerMs;
}

bool stopped_by_signal(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::stringstream text;
  text << in.rdbuf();
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the
  // state follows the last ')'.
  const std::string stat = text.str();
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
}

}  // namespace brigade::elastic

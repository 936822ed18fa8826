// The progress watchdog: decides from a worker's heartbeat slot whether it
// hangs. Pure (the caller passes the time), so it is tested with a fake clock.
//
// Two bounds, because a hang has two shapes:
//   - silent: no heartbeat for heartbeat_timeout_ms. The heartbeat thread
//     beats every 100 ms whatever training does, so only a stopped or frozen
//     process falls silent; 2 s leaves a margin of 20 beats for a thread
//     delayed by a loaded machine and still detects within the 3 s the
//     issue asks.
//   - stuck: beating, but no step completed for step_timeout_ms (a peer
//     stuck in a collective, a deadlock). A step legitimately takes long
//     (GPT-2 small: about 5 s on 2 cores; the first one includes set-up and
//     data preparation; evaluation and the final save add to the last), so
//     this bound is generous (600 s by default) and configurable.
// A worker that never beat (a program that does not use the heartbeat, or
// one still starting) is watched for its exit only; the step clock starts
// when training is set up (start_step), since set-up is bounded by the
// communicators' own rendezvous timeouts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "brigade/elastic/heartbeat.h"

namespace brigade::elastic {

struct WatchdogOptions {
  int64_t heartbeat_timeout_ms = 2'000;
  int64_t step_timeout_ms = 600'000;
};

struct Stall {
  enum class Kind { kSilent, kStuck } kind;
  int64_t since_ns = 0;  // the last heartbeat, or the last step (or set-up)
  std::string what;      // "no heartbeat for 2.1 s (stopped or frozen)"
};

std::optional<Stall> check_progress(const WorkerProgress& progress, int64_t now_ns,
                                    const WatchdogOptions& options);

}  // namespace brigade::elastic

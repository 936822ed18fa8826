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
// A third way to know, faster than either bound: a worker the kernel holds
// stopped by a signal (SIGSTOP, SIGTSTP: state T in /proc/PID/stat) makes
// no progress until someone continues it, so once its heartbeat is late
// (stopped_after_ms, a few beats) that state is proof of the hang; the 2 s
// silence is for what the kernel cannot tell apart from work (a frozen
// thread, a dead lock). At a fault a minute, the 1.7 s this saves on each
// stop is about 0.7% of the run's ETTR (issue 14).
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
  int64_t stopped_after_ms = 250;
};

struct Stall {
  enum class Kind { kSilent, kStuck } kind;
  int64_t since_ns = 0;  // the last heartbeat, or the last step (or set-up)
  std::string what;      // "no heartbeat for 2.1 s (stopped or frozen)"
};

// stopped: the kernel holds the worker stopped by a signal
// (stopped_by_signal), read by the caller once the beat is late.
std::optional<Stall> check_progress(const WorkerProgress& progress, int64_t now_ns,
                                    const WatchdogOptions& options, bool stopped = false);

// True when the heartbeat is late enough that the caller should ask the
// kernel whether the worker is stopped (not every tick for every worker).
bool beat_is_late(const WorkerProgress& progress, int64_t now_ns, const WatchdogOptions& options);

// Whether process `pid` is stopped by a signal (state T in /proc/PID/stat);
// false if it is running, sleeping, gone or unreadable.
bool stopped_by_signal(int pid);

}  // namespace brigade::elastic

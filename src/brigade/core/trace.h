// Trace events: what `brigade train --trace STEPS` records for the window
// of steps it asks for (diag/trace.h turns them into RUN_DIR/trace.json, the
// Chrome trace format that Perfetto and chrome://tracing open).
//
// The model, the pipeline executor, the step clock and the checkpoint writer
// mark their spans with a Scope; nothing is recorded unless the window is
// open, and a closed window costs one relaxed atomic load per Scope, so the
// marks stay in the code for good. Collectives are not marked here: the
// flight recorder (comm/flight_recorder.h) already times every one of them.
//
// Events go to one process-wide list under a mutex: the spans marked are
// milliseconds long (a block's forward, a micro-batch, a checkpoint write),
// so a few hundred events per step cost nothing measurable. The list is
// capped (kMaxEvents); what does not fit is counted, not kept.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "brigade/core/clock.h"

namespace brigade::trace {

// One span (end_ns > begin_ns) or instant (end_ns == begin_ns) on the
// steady clock. `name` and `category` are string literals: recording
// copies no text. `index` is what the name is numbered by (a layer, a
// micro-batch; -1: none), `chunk` the model chunk of a pipeline stage
// (-1: none).
struct Event {
  const char* category = "";
  const char* name = "";
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int64_t index = -1;
  int64_t chunk = -1;
  int thread = 0;  // the recording thread's id (gettid)
};

inline constexpr size_t kMaxEvents = 1 << 20;

namespace detail {
extern std::atomic<bool> g_on;
}

inline bool on() {
  return detail::g_on.load(std::memory_order_relaxed);
}

// Opens or closes the window. Opening clears what an earlier window left.
void start();
void stop();

void record(const Event& event);
// A moment: an alarm raised, a fault seen.
void instant(const char* category, const char* name, int64_t index = -1);

// The window's events, oldest first, and how many did not fit.
struct Recorded {
  std::vector<Event> events;
  int64_t dropped = 0;
};
Recorded take();

// Marks the span of its lifetime, when the window is open at its start.
class Scope {
 public:
  Scope(const char* category, const char* name, int64_t index = -1, int64_t chunk = -1)
      : on_(on()) {
    if (!on_) return;
    event_.category = category;
    event_.name = name;
    event_.index = index;
    event_.chunk = chunk;
    event_.begin_ns = now_ns();
  }
  ~Scope() {
    if (!on_) return;
    event_.end_ns = now_ns();
    record(event_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
  Event event_;
};

}  // namespace brigade::trace

// Where a rank's step time goes: the wall time of each training-loop
// iteration split into exclusive parts, each measured on the steady clock
// around the code that spends it (not estimated):
//
//   compute    forward, backward, the gradient norm, the loss scaling;
//              also an injected straggler's extra time (it stands for compute)
//   optimizer  the AdamW update (kept apart from compute: its cost grows
//              with the parameters, not the tokens)
//   comm       waits on a data- or tensor-parallel collective that nothing
//              overlapped: the gradient reduction's finish, ZeRO's gathers,
//              tp's all-reduces, the small agreements (loss, norm, stop
//              signal) and the per-step metrics gather
//   bubble     a pipeline stage waiting on a peer's activation or gradient
//              (its receives and, at the step's end, its sends), and then
//              for its peers to drain (the loss's sum over the stages, the
//              first collective after the lists, where a stage that
//              finished early waits; the tied wte's sum after it is comm)
//   data       filling the micro-batches' tokens (the sampler's reads)
//   ckpt       checkpoint or snapshot stalls: a save's copy, its agreement
//              poll, the update waiting for an unstaged snapshot's read
//   eval       validation passes between steps
//   other      the remainder: the step's wall time minus the parts above
//              (the loop's bookkeeping, the metrics line, the heartbeat).
//
// By construction the parts add up to the step's wall time; "other" staying
// small (a few percent) is what says the sections miss nothing.
//
// A StepClock keeps a stack of open sections: time goes to the innermost
// one (to "other" when none is open), so a data read inside forward is
// data, not compute. Lower layers that measure their own waits (the
// pipeline's bubble, tp's all-reduce time, ZeRO 3's gathers) report
// milliseconds, which move() takes from the enclosing section. Single
// threaded: the training thread's own time only.
//
// The clock also counts, within compute, the time the kernel kept the
// training thread runnable but off every core (its run-queue wait, from
// /proc/thread-self/schedstat, read only where compute starts and stops:
// about 1 us a read). On a shared or oversubscribed machine that is most
// of what makes one rank's compute longer than another's for a while
// without the rank being slow, so the straggler score leaves it out
// (train/straggler.h).
//
// Within a trace window (core/trace.h) each section is also a span,
// category "step", named by its part.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace brigade {

enum class StepPart { kCompute, kOptimizer, kComm, kBubble, kData, kCheckpoint, kEval, kOther };
inline constexpr int kStepParts = 8;

// "compute", "optimizer", "comm", "bubble", "data", "ckpt", "eval", "other".
const char* step_part_name(StepPart part);

struct StepBreakdown {
  double step_ms = 0;  // the wall time the parts split
  std::array<double, kStepParts> ms{};
  // Of compute, the time the thread waited for a core (0 where the kernel
  // keeps no schedstat).
  double compute_runqueue_ms = 0;
  // Compute less that wait: what the rank's own speed decides.
  double compute_on_cpu_ms() const;
  // The CPU time the rank's whole process spent in the window, every thread
  // (training, OpenMP, communication, a save's writer). Where the ranks fill
  // the cores, work added beside the step (a snapshot's) costs the step this
  // much wall time; unlike wall time it does not count who waited for a
  // core (it still drifts with the host's load on memory).
  // bench/compare_snapshots.py compares runs by it too.
  double process_cpu_ms = 0;

  double& operator[](StepPart p) { return ms[static_cast<size_t>(p)]; }
  double operator[](StepPart p) const { return ms[static_cast<size_t>(p)]; }
  double sum_ms() const;
  // The parts as one flat vector (step_ms first) and back: what the ranks
  // all-gather each step.
  std::vector<double> to_vector() const;
  static StepBreakdown from_vector(const double* values);
  static constexpr int kVectorSize = 3 + kStepParts;
  // "compute 71% comm 12% bubble 9% data 1% ckpt 0% other 1%" (optimizer
  // and eval only when they took any time).
  std::string percentages() const;
};

class StepClock {
 public:
  StepClock();
  ~StepClock();
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;

  // Whether compute_runqueue_ms is measured: false where
  // /proc/thread-self/schedstat is missing or reads all zeros (the
  // kernel's scheduler accounting is off); it is then 0.
  bool counts_runqueue() const { return schedstat_fd_ >= 0; }

  // Starts a new step window now; whatever was open stays open.
  void restart();
  // Closes the window at now: its parts (other = the rest), and the next
  // window starts. Open sections stay open and go on accruing.
  StepBreakdown end_step();

  void enter(StepPart part);
  void leave();
  // `ms` measured inside the innermost open section (or "other") by a lower
  // layer that spent it as `to`: moved from that section to `to`.
  void move(double ms, StepPart to);

  // Opens a section for its lifetime.
  class Section {
   public:
    Section(StepClock& clock, StepPart part) : clock_(clock) { clock_.enter(part); }
    ~Section() { clock_.leave(); }
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;

   private:
    StepClock& clock_;
  };

 private:
  // Charges the time since the last event to the innermost section.
  void charge(int64_t now);
  StepPart current() const { return open_.empty() ? StepPart::kOther : open_.back(); }
  // Call after current() changed: starts counting compute's run-queue wait.
  void entered(StepPart was);
  // The thread's run-queue wait so far, ns (0 without schedstat).
  int64_t runqueue_ns() const;
  bool read_schedstat(int64_t& on_cpu_ns, int64_t& runqueue_ns) const;

  int schedstat_fd_ = -1;
  int64_t runqueue_at_ns_ = 0;  // runqueue_ns() when compute became current

  std::vector<StepPart> open_;
  std::vector<int64_t> opened_ns_;  // when each open section opened: its trace span
  StepBreakdown window_;
  int64_t window_start_ns_ = 0;
  int64_t window_start_cpu_ns_ = 0;  // the process's CPU time then
  int64_t last_ns_ = 0;
};

}  // namespace brigade

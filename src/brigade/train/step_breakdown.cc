#include "brigade/train/step_breakdown.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/trace.h"

namespace brigade {

const char* step_part_name(StepPart part) {
  switch (part) {
    case StepPart::kCompute:
      return "compute";
    case StepPart::kOptimizer:
      return "optimizer";
    case StepPart::kComm:
      return "comm";
    case StepPart::kBubble:
      return "bubble";
    case StepPart::kData:
      return "data";
    case StepPart::kCheckpoint:
      return "ckpt";
    case StepPart::kEval:
      return "eval";
    case StepPart::kOther:
      return "other";
  }
  return "?";
}

double StepBreakdown::sum_ms() const {
  double sum = 0;
  for (double v : ms) sum += v;
  return sum;
}

double StepBreakdown::compute_on_cpu_ms() const {
  return std::max(0.0, (*this)[StepPart::kCompute] - compute_runqueue_ms);
}

std::vector<double> StepBreakdown::to_vector() const {
  std::vector<double> v = {step_ms, compute_runqueue_ms, process_cpu_ms};
  v.insert(v.end(), ms.begin(), ms.end());
  return v;
}

StepBreakdown StepBreakdown::from_vector(const double* values) {
  StepBreakdown b;
  b.step_ms = values[0];
  b.compute_runqueue_ms = values[1];
  b.process_cpu_ms = values[2];
  for (int i = 0; i < kStepParts; ++i) b.ms[static_cast<size_t>(i)] = values[3 + i];
  return b;
}

std::string StepBreakdown::percentages() const {
  std::string out;
  for (int i = 0; i < kStepParts; ++i) {
    const auto part = static_cast<StepPart>(i);
    const double v = ms[static_cast<size_t>(i)];
    if ((part == StepPart::kOptimizer || part == StepPart::kEval) && v <= 0) continue;
    const char* name = part == StepPart::kOptimizer ? "opt" : step_part_name(part);
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : " ", name,
                       step_ms > 0 ? 100.0 * v / step_ms : 0.0);
  }
  return out;
}

StepClock::StepClock()
    : schedstat_fd_(::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)) {
  // "0 0 0": the kernel keeps the file but not the accounting (a thread
  // that has run has spent time on a cpu).
  if (schedstat_fd_ >= 0) {
    int64_t on_cpu = 0, waited = 0;
    if (!read_schedstat(on_cpu, waited) || (on_cpu == 0 && waited == 0)) {
      ::close(schedstat_fd_);
      schedstat_fd_ = -1;
    }
  }
  restart();
}

StepClock::~StepClock() {
  if (schedstat_fd_ >= 0) ::close(schedstat_fd_);
}

bool StepClock::read_schedstat(int64_t& on_cpu_ns, int64_t& runqueue_ns) const {
  // "<ns on a cpu> <ns waiting on a run queue> <time slices>"
  char text[96];
  const ssize_t n = ::pread(schedstat_fd_, text, sizeof(text) - 1, 0);
  if (n <= 0) return false;
  text[n] = '\0';
  char* end = nullptr;
  on_cpu_ns = std::strtoll(text, &end, 10);
  runqueue_ns = std::strtoll(end, nullptr, 10);
  return true;
}

int64_t StepClock::runqueue_ns() const {
  int64_t on_cpu = 0, waited = 0;
  if (schedstat_fd_ < 0 || !read_schedstat(on_cpu, waited)) return 0;
  return waited;
}

void StepClock::charge(int64_t now) {
  window_[current()] += static_cast<double>(now - last_ns_) * 1e-6;
  last_ns_ = now;
  if (current() == StepPart::kCompute) {
    const int64_t runqueue = runqueue_ns();
    window_.compute_runqueue_ms += static_cast<double>(runqueue - runqueue_at_ns_) * 1e-6;
    runqueue_at_ns_ = runqueue;
  }
}

void StepClock::entered(StepPart was) {
  if (current() == StepPart::kCompute && was != StepPart::kCompute) runqueue_at_ns_ = runqueue_ns();
}

void StepClock::restart() {
  window_ = StepBreakdown{};
  window_start_ns_ = last_ns_ = now_ns();
  window_start_cpu_ns_ = process_cpu_ns();
}

StepBreakdown StepClock::end_step() {
  const int64_t now = now_ns();
  charge(now);
  StepBreakdown b = window_;
  b.step_ms = static_cast<double>(now - window_start_ns_) * 1e-6;
  const int64_t cpu = process_cpu_ns();
  b.process_cpu_ms = static_cast<double>(cpu - window_start_cpu_ns_) * 1e-6;
  // "other" is what no section claimed: the window minus the rest (which
  // also absorbs the rounding of the per-section sums).
  double claimed = 0;
  for (int i = 0; i < kStepParts; ++i) {
    if (static_cast<StepPart>(i) != StepPart::kOther) claimed += b.ms[static_cast<size_t>(i)];
  }
  b[StepPart::kOther] = b.step_ms - claimed;
  window_ = StepBreakdown{};
  window_start_ns_ = now;
  window_start_cpu_ns_ = cpu;
  return b;
}

void StepClock::enter(StepPart part) {
  const int64_t now = now_ns();
  charge(now);
  const StepPart was = current();
  open_.push_back(part);
  opened_ns_.push_back(now);
  entered(was);
}

void StepClock::leave() {
  BRIGADE_CHECK(!open_.empty(), "StepClock::leave with no section open");
  const int64_t now = now_ns();
  charge(now);
  const StepPart was = current();
  if (trace::on()) {
    trace::Event e;
    e.category = "step";
    e.name = step_part_name(was);
    e.begin_ns = opened_ns_.back();
    e.end_ns = now;
    trace::record(e);
  }
  open_.pop_back();
  opened_ns_.pop_back();
  entered(was);
}

void StepClock::move(double ms, StepPart to) {
  if (ms <= 0) return;
  charge(now_ns());
  window_[current()] -= ms;
  window_[to] += ms;
}

}  // namespace brigade

// Monotonic time for step timing and trace events.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

namespace brigade {

inline constexpr int64_t kNsPerMs = 1'000'000;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Microseconds since the Unix epoch (the wall clock): what times taken on
// different machines are compared on (to the precision of their clocks'
// synchronisation), where each monotonic clock starts at its own boot.
inline int64_t unix_us_now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A time of now_ns()'s clock on the wall clock (unix_us_now's), through the
// two clocks' offset read now: the wall clock read between two reads of the
// steady one, whose midpoint is taken, so a preemption between the reads
// shifts the result by half of it at most.
inline int64_t steady_to_unix_us(int64_t steady_ns) {
  const int64_t before = now_ns();
  const int64_t wall_us = unix_us_now();
  const int64_t after = now_ns();
  return wall_us - (before + (after - before) / 2 - steady_ns) / 1'000;
}

// The kernel's boot id (/proc/sys/kernel/random/boot_id; empty where it
// cannot be read): two stamps of now_ns() taken under the same one share a
// clock (one kernel, whatever its namespaces), else only their wall-clock
// conversions compare, to the machines' clock synchronisation.
std::string boot_id();

inline int64_t cpu_clock_ns(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}
// CPU time the calling thread has used, in ns.
inline int64_t thread_cpu_ns() {
  return cpu_clock_ns(CLOCK_THREAD_CPUTIME_ID);
}
// CPU time all threads of this process have used, in ns.
inline int64_t process_cpu_ns() {
  return cpu_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

// Measures elapsed time since construction or the last reset().
class Stopwatch {
 public:
  Stopwatch() : start_ns_(now_ns()) {}
  void reset() { start_ns_ = now_ns(); }
  double elapsed_ms() const { return static_cast<double>(now_ns() - start_ns_) * 1e-6; }
  double elapsed_s() const { return static_cast<double>(now_ns() - start_ns_) * 1e-9; }

 private:
  int64_t start_ns_;
};

}  // namespace brigade

// Monotonic time for step timing and trace events.
#pragma once

#include <chrono>
#include <cstdint>

namespace brigade {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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

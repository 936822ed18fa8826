// When to split a loop across threads. Forking and joining an OpenMP team
// costs microseconds, and far more when the cores are shared with other
// processes (a waiting thread may be descheduled); below this many
// elements of work a kernel runs on the calling thread alone.
#pragma once

#include <cstdint>

namespace brigade::cpu {

inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

inline bool worth_threading(int64_t elements) {
  return elements >= kMinParallelWork;
}

}  // namespace brigade::cpu

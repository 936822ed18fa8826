// Facts about this process that reports need.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace brigade {

// The most resident memory this process has held so far, in bytes.
inline int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace brigade

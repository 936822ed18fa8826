// Forked ranks joined by one shared-memory group, each with a flat float
// buffer in the group's segment (the zero-copy path) or on the heap: the two
// places training puts its gradient and parameter buffers.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/aligned_buffer.h"
#include "testing/forked_ranks.h"

namespace brigade::testing {

// A shared-memory segment name no other test process or earlier group of
// this one uses.
inline std::string unique_segment_name(const char* prefix = "brigade-test") {
  static int counter = 0;
  return fmt::format("/{}-{}-{}", prefix, ::getpid(), counter++);
}

// Runs body(comm, buffer) in `size` forked ranks of a group named "dp";
// buffer holds `floats` zeros. Reaps every rank; a rank that threw or did
// not finish within a minute fails the test.
inline void run_shm_ranks(int size, int64_t floats, bool shared,
                          const std::function<void(Communicator&, float*)>& body) {
  const int64_t bytes = (floats * 4 + 4095) / 4096 * 4096;
  const std::string segment = unique_segment_name("brigade-test-ranks");
  const auto pids = fork_ranks(size, [&](int rank) {
    ShmCommunicatorOptions options;
    options.segment_name = segment;
    options.group_name = "dp";
    options.rank = rank;
    options.size = size;
    options.timeout_ms = 20000;
    options.shared_bytes = shared ? bytes : 0;
    ShmCommunicator comm(options);
    FloatBuffer heap;
    float* buffer = nullptr;
    if (shared) {
      buffer = static_cast<float*>(comm.shared_buffer());
    } else {
      heap = FloatBuffer(floats);
      buffer = heap.data();
    }
    std::fill(buffer, buffer + floats, 0.0f);
    body(comm, buffer);
  });
  const auto codes = reap_all(pids, std::chrono::seconds(60));
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace brigade::testing

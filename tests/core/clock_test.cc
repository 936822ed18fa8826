// The steady clock's times on the wall clock (core/clock.h): what an
// incident's timeline places the agents' fault and detection with, beside the
// workers' dumps stamped on the wall clock (diag/incident_trace.h).
#include "brigade/core/clock.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace brigade {
namespace BRIGADE_TEST_FILE {

TEST(Clock, ASteadyTimeLandsOnTheWallClockAtItsDistanceFromNow) {
  constexpr int64_t kFiveSecondsNs = 5'000'000'000;
  const int64_t steady = now_ns() - kFiveSecondsNs;
  const int64_t wall = unix_us_now();
  const int64_t placed = steady_to_unix_us(steady);
  // Five seconds before now, to within the reads' own time (a second is a
  // bound for a machine loaded far past its cores, not a measurement).
  EXPECT_NEAR(static_cast<double>(placed), static_cast<double>(wall - 5'000'000), 1e6);
  // And a second later on the steady clock is a second later on the wall.
  const int64_t later = steady_to_unix_us(steady + 1'000'000'000);
  EXPECT_NEAR(static_cast<double>(later - placed), 1e6, 5e5);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

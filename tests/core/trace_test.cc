// core/trace.h: spans are kept only while the window is open, a span begun
// before it opened is not, take() empties the list, and what does not fit
// under the cap is counted, not kept.
#include "brigade/core/trace.h"

#include <gtest/gtest.h>

#include <string>

namespace brigade::trace {
namespace BRIGADE_TEST_FILE {

TEST(Trace, KeepsSpansOnlyWhileTheWindowIsOpen) {
  { const Scope before("compute", "closed"); }
  instant("alarm", "closed");
  start();
  {
    const Scope outer("compute", "outer", 3, 1);
    const Scope inner("compute", "inner");
  }
  instant("alarm", "raised", 7);
  stop();
  { const Scope after("compute", "after"); }
  const Recorded r = take();
  ASSERT_EQ(r.events.size(), 3u);
  // Recorded as they end: the inner span first.
  EXPECT_EQ(std::string(r.events[0].name), "inner");
  EXPECT_EQ(std::string(r.events[1].name), "outer");
  EXPECT_EQ(r.events[1].index, 3);
  EXPECT_EQ(r.events[1].chunk, 1);
  EXPECT_LE(r.events[1].begin_ns, r.events[0].begin_ns);
  EXPECT_GE(r.events[1].end_ns, r.events[0].end_ns);
  EXPECT_EQ(std::string(r.events[2].name), "raised");
  EXPECT_EQ(r.events[2].begin_ns, r.events[2].end_ns);
  EXPECT_NE(r.events[2].thread, 0);
  EXPECT_EQ(r.dropped, 0);
  EXPECT_TRUE(take().events.empty()) << "take() empties the list";
}

TEST(Trace, ASpanBegunBeforeTheWindowIsLeftOut) {
  {
    const Scope straddling("compute", "straddling");
    start();
  }
  stop();
  EXPECT_TRUE(take().events.empty());
}

TEST(Trace, BeyondTheCapEventsAreCountedNotKept) {
  start();
  for (size_t i = 0; i < kMaxEvents + 5; ++i) instant("alarm", "many");
  stop();
  const Recorded r = take();
  EXPECT_EQ(r.events.size(), kMaxEvents);
  EXPECT_EQ(r.dropped, 5);
  start();  // a new window starts empty
  stop();
  EXPECT_TRUE(take().events.empty());
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::trace

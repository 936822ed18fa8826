// The bucket plan: buckets tile the padded buffer from the end, every bucket
// splits into dp equal 64-byte-aligned slices, and the slices of one rank
// are exactly 1/dp of the buffer; cut points (ZeRO 3's block boundaries)
// become bucket boundaries.
#include "brigade/parallel/grad_buckets.h"

#include <gtest/gtest.h>

#include <vector>

#include "brigade/core/error.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

// Every element of [0, padded) in exactly one bucket, the first bucket
// ending at the end, and each bucket's slices tiling it in rank order.
void expect_consistent(const BucketPlan& plan) {
  const int64_t unit = plan.dp() * BucketPlan::kAlignFloats;
  EXPECT_EQ(plan.padded_size() % unit, 0);
  int64_t end = plan.padded_size();
  for (size_t i = 0; i < plan.buckets().size(); ++i) {
    const FlatRange b = plan.buckets()[i];
    EXPECT_EQ(b.end, end) << "bucket " << i;
    EXPECT_GT(b.size(), 0) << "bucket " << i;
    EXPECT_EQ(b.size() % unit, 0) << "bucket " << i;
    int64_t next = b.begin;
    for (int r = 0; r < plan.dp(); ++r) {
      const FlatRange s = plan.slice(static_cast<int64_t>(i), r);
      EXPECT_EQ(s.begin, next);
      EXPECT_EQ(s.begin % BucketPlan::kAlignFloats, 0);
      EXPECT_EQ(s.size(), b.size() / plan.dp());
      // What a rank releases: the bucket's parts before and after its slice.
      const auto unowned = plan.unowned(static_cast<int64_t>(i), r);
      EXPECT_EQ(unowned[0].begin, b.begin);
      EXPECT_EQ(unowned[0].end, s.begin);
      EXPECT_EQ(unowned[1].begin, s.end);
      EXPECT_EQ(unowned[1].end, b.end);
      next = s.end;
    }
    EXPECT_EQ(next, b.end);
    end = b.begin;
  }
  EXPECT_EQ(end, 0);
  for (int r = 0; r < plan.dp(); ++r) {
    int64_t owned = 0;
    for (const FlatRange& s : plan.owned(r)) owned += s.size();
    EXPECT_EQ(owned, plan.owned_size());
    EXPECT_EQ(owned * plan.dp(), plan.padded_size());
  }
}

TEST(BucketPlan, FixedSizeBucketsTileThePaddedBufferFromTheEnd) {
  for (int dp : {1, 2, 3, 4, 7}) {
    const BucketPlan plan(100'003, dp, 10'000);
    expect_consistent(plan);
    EXPECT_GE(plan.padded_size(), 100'003);
    EXPECT_LT(plan.padded_size(), 100'003 + dp * BucketPlan::kAlignFloats);
    // All but the first bucket of the buffer (the last one reduced) are full size.
    const auto& buckets = plan.buckets();
    for (size_t i = 0; i + 1 < buckets.size(); ++i) EXPECT_EQ(buckets[i].size(), buckets[0].size());
    EXPECT_LE(buckets.back().size(), buckets[0].size());
  }
}

TEST(BucketPlan, ABucketLargerThanTheBufferIsTheWholeBuffer) {
  const BucketPlan plan(1000, 4, 1 << 30);
  expect_consistent(plan);
  ASSERT_EQ(plan.buckets().size(), 1u);
  EXPECT_EQ(plan.buckets()[0].size(), plan.padded_size());
}

TEST(BucketPlan, CutPointsBecomeBoundariesRoundedDown) {
  const BucketPlan plan(1000, 2, std::vector<int64_t>{100, 500, 501, 0});
  expect_consistent(plan);
  // 100 -> 96 and 500, 501 -> 480 (multiples of 2 * 16); 0 and the end implied.
  std::vector<int64_t> begins;
  for (const FlatRange& b : plan.buckets()) begins.push_back(b.begin);
  EXPECT_EQ(begins, (std::vector<int64_t>{480, 96, 0}));
}

TEST(BucketPlan, RejectsNonsense) {
  EXPECT_THROW(BucketPlan(1000, 0, 100), Error);
  EXPECT_THROW(BucketPlan(0, 2, 100), Error);
  EXPECT_THROW(BucketPlan(1000, 2, int64_t{0}), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

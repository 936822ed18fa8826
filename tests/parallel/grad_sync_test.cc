// GradSync on two forked ranks over the shm backend, with the gradient
// buffer in the segment (the zero-copy path) or on the heap: a bucket is
// handed to the communicator only once the model reports its whole range
// final (a ready offset inside a bucket must not launch it), the reductions
// hold the sums, the trace places the overlapped launches before the end of
// backward, and ZeRO 2's release really returns the unowned pages.
#include "brigade/parallel/grad_sync.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/aligned_buffer.h"
#include "brigade/core/pages.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using testing::require;

constexpr int kRanks = 2;
// Three buckets of 40,000 floats (160 KB, 39 pages): [80k, 120k) is
// reduced first, then [40k, 80k), then [0, 40k).
constexpr int64_t kElements = 120'000;
constexpr int64_t kBucket = 40'000;
constexpr int64_t kPage = 4096;

// Small integers, so sums are exact whatever the order of addition.
float gradient(int rank, int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 23 - 11);
}
float summed(int64_t i) {
  float sum = 0;
  for (int r = 0; r < kRanks; ++r) sum += gradient(r, i);
  return sum;
}

void write_gradients(float* grads, int rank, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) grads[i] = gradient(rank, i);
}

// Runs body(comm, grads) in each of kRanks forked ranks, the gradient buffer
// (plan.padded_size() floats) in the segment if `shared`, else on the heap.
void run_ranks(bool shared, const BucketPlan& plan,
               const std::function<void(Communicator&, float*)>& body) {
  testing::run_shm_ranks(kRanks, plan.padded_size(), shared, body);
}

class GradSyncTest : public ::testing::TestWithParam<bool> {};

// Backward reports offsets going down. A report inside bucket 1 launches
// bucket 0 only: bucket 1 still has gradients to come below the offset,
// and those must be in its reduction.
TEST_P(GradSyncTest, AReadyOffsetInsideABucketDoesNotLaunchIt) {
  const BucketPlan plan(kElements, kRanks, kBucket);
  ASSERT_EQ(plan.buckets().size(), 3u);
  run_ranks(GetParam(), plan, [&](Communicator& comm, float* grads) {
    const int rank = comm.rank();
    GradSync sync(comm, plan, grads, GradSync::Mode::kAllReduce, GetParam());
    for (int step = 0; step < 2; ++step) {
      std::fill(grads, grads + plan.padded_size(), 0.0f);
      sync.arm();
      // The last 60k floats are final: bucket 0 and half of bucket 1.
      write_gradients(grads, rank, 60'000, kElements);
      sync.on_ready(60'000);
      require(sync.launched() == 1,
              "ready from 60000 launched {} buckets, expected 1 (bucket 1 "
              "is [40000, 80000))",
              sync.launched());
      // The rest of bucket 1 arrives; its start is a boundary.
      write_gradients(grads, rank, 40'000, 60'000);
      sync.on_ready(40'000);
      require(sync.launched() == 2, "ready from 40000 launched {} buckets, expected 2",
              sync.launched());
      write_gradients(grads, rank, 0, 40'000);
      sync.on_ready(0);
      require(sync.launched() == 3, "ready from 0 launched {} buckets", sync.launched());
      sync.finish();
      for (int64_t i = 0; i < plan.padded_size(); ++i) {
        const float expected = i < kElements ? summed(i) : 0.0f;
        require(grads[i] == expected, "step {}: element {} is {} after the all-reduce, expected {}",
                step, i, grads[i], expected);
      }
    }
  });
}

// The trace: bucket 0 was launched by an early report and bucket 2 by the
// last one; the end of backward is stamped between, before bucket 2.
TEST_P(GradSyncTest, TimingsPlaceOverlappedLaunchesBeforeBackwardEnds) {
  const BucketPlan plan(kElements, kRanks, kBucket);
  run_ranks(GetParam(), plan, [&](Communicator& comm, float* grads) {
    GradSync sync(comm, plan, grads, GradSync::Mode::kReduceScatter, GetParam());
    sync.arm();
    write_gradients(grads, comm.rank(), 0, kElements);
    sync.on_ready(40'000);
    sync.on_ready(0);
    sync.finish();
    const auto& t = sync.timings();
    const double end = sync.backward_end_ms();
    require(t.size() == 3, "{} timings", t.size());
    require(end >= 0, "no end of backward recorded");
    for (size_t i = 0; i < t.size(); ++i) {
      require(t[i].bytes == kBucket * 4, "bucket {}: {} bytes", i, t[i].bytes);
      require(t[i].issued_ms <= t[i].done_ms, "bucket {} done at {} ms, before its issue at {}", i,
              t[i].done_ms, t[i].issued_ms);
    }
    require(t[0].issued_ms < end && t[1].issued_ms < end,
            "buckets 0 and 1 were launched before backward ended ({} and {} ms vs {} ms)",
            t[0].issued_ms, t[1].issued_ms, end);
    require(t[2].issued_ms >= end,
            "bucket 2 could only start at the end of backward ({} ms), "
            "but was issued at {} ms",
            end, t[2].issued_ms);
  });
}

// Reduce-scatter leaves each rank the sums of its slices. With release (ZeRO
// 2) the rest reads as zeros and its pages are gone: resident bytes are the
// owned share plus page rounding. Without release everything stays.
TEST_P(GradSyncTest, ReleaseReturnsTheUnownedPages) {
  const BucketPlan plan(kElements, kRanks, kBucket);
  for (const bool release : {true, false}) {
    SCOPED_TRACE(release ? "release" : "keep");
    run_ranks(GetParam(), plan, [&](Communicator& comm, float* grads) {
      const int rank = comm.rank();
      GradSync sync(
          comm, plan, grads,
          release ? GradSync::Mode::kReduceScatterAndRelease : GradSync::Mode::kReduceScatter,
          GetParam());
      sync.arm();
      write_gradients(grads, rank, 0, kElements);
      sync.on_ready(0);
      sync.finish();
      // Measured first: reading released memory brings pages back.
      const int64_t whole = plan.padded_size() * 4;
      const int64_t mine = plan.owned_size() * 4;
      const int64_t resident = resident_bytes(grads, grads + plan.padded_size());
      const int64_t bound = mine + 4 * kPage * static_cast<int64_t>(plan.buckets().size());
      if (release) {
        require(resident >= mine && resident <= bound,
                "{} bytes resident after the release; expected between the owned {} and {}",
                resident, mine, bound);
      } else {
        require(resident >= whole, "{} of {} bytes resident without release", resident, whole);
      }
      std::vector<bool> owned(static_cast<size_t>(plan.padded_size()), false);
      for (const FlatRange& s : plan.owned(rank)) {
        std::fill(owned.begin() + s.begin, owned.begin() + s.end, true);
      }
      // Without release the unowned part is stale: nothing to check there.
      for (int64_t i = 0; i < kElements; ++i) {
        if (!owned[i] && !release) continue;
        const float expected = owned[i] ? summed(i) : 0.0f;
        require(grads[i] == expected, "element {} (owned: {}) is {}, expected {}", i,
                static_cast<bool>(owned[i]), grads[i], expected);
      }
    });
  }
}

// Backward writes the buckets in reduction order; under release each one's
// unowned pages come back in one call just before (when the step is armed
// for bucket 0, when its predecessor is launched for the others), not page
// by page under the kernels, and not earlier: the rest stay released.
TEST_P(GradSyncTest, TheNextBucketsPagesComeBackJustBeforeBackwardWritesThem) {
  if (!populates_in_one_call())
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  const BucketPlan plan(kElements, kRanks, kBucket);
  run_ranks(GetParam(), plan, [&](Communicator& comm, float* grads) {
    const int rank = comm.rank();
    GradSync sync(comm, plan, grads, GradSync::Mode::kReduceScatterAndRelease, GetParam());
    auto unowned_resident = [&](size_t index) {
      const FlatRange bucket = plan.buckets()[index];
      const FlatRange mine = plan.slice(static_cast<int64_t>(index), rank);
      // Whole pages only: the edges' partial pages never leave.
      auto whole = [&](int64_t begin, int64_t end) -> int64_t {
        const auto first = (reinterpret_cast<uintptr_t>(grads + begin) + kPage - 1) / kPage * kPage;
        const auto last = reinterpret_cast<uintptr_t>(grads + end) / kPage * kPage;
        return last > first ? resident_bytes(reinterpret_cast<const void*>(first),
                                             reinterpret_cast<const void*>(last))
                            : 0;
      };
      return whole(bucket.begin, mine.begin) + whole(mine.end, bucket.end);
    };
    auto unowned_bytes = [&](size_t index) {
      return (plan.buckets()[index].size() - plan.slice(static_cast<int64_t>(index), rank).size()) *
             4;
    };
    // A first step leaves only the owned slices.
    sync.arm();
    write_gradients(grads, rank, 0, kElements);
    sync.on_ready(0);
    sync.finish();
    for (size_t i = 0; i < 3; ++i) {
      require(unowned_resident(i) == 0, "bucket {}: {} unowned bytes resident after the step", i,
              unowned_resident(i));
    }
    const int64_t slack = 2 * kPage;
    sync.arm();
    require(unowned_resident(0) >= unowned_bytes(0) - slack,
            "armed: bucket 0 has {} of its {} unowned bytes back", unowned_resident(0),
            unowned_bytes(0));
    require(unowned_resident(1) == 0 && unowned_resident(2) == 0,
            "armed: buckets 1 and 2 came back early ({} and {} bytes)", unowned_resident(1),
            unowned_resident(2));
    const FlatRange first = plan.buckets()[0];
    write_gradients(grads, rank, first.begin, first.end);
    sync.on_ready(first.begin);
    require(unowned_resident(1) >= unowned_bytes(1) - slack,
            "bucket 0 launched: bucket 1 has {} of its {} unowned bytes back", unowned_resident(1),
            unowned_bytes(1));
    require(unowned_resident(2) == 0, "bucket 0 launched: bucket 2 came back early ({} bytes)",
            unowned_resident(2));
    write_gradients(grads, rank, 0, first.begin);
    sync.on_ready(0);
    sync.finish();
    for (int64_t i = 0; i < kElements; ++i) {
      const bool owned = [&] {
        for (const FlatRange& s : plan.owned(rank)) {
          if (i >= s.begin && i < s.end) return true;
        }
        return false;
      }();
      require(grads[i] == (owned ? summed(i) : 0.0f), "element {} is {} after the second step", i,
              grads[i]);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Buffer, GradSyncTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "shm" : "heap"; });

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

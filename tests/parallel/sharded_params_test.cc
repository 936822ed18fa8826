// ShardedParams (ZeRO 3) on two forked ranks over the shm backend, the
// parameters in the segment or on the heap. Three "blocks" of 50,008 floats
// are cut as ZeRO 3 cuts them, at the block starts rounded down to the slice
// alignment, so each of the first two blocks reaches a few floats into the
// next block's bucket: the straddling case. Checked: acquiring a block
// gathers exactly the buckets it overlaps, a prefetch starts the next
// block's gathers in order and the acquire after it gathers nothing again,
// a bucket stays while any block holds it, and a release returns the
// unowned pages (measured with mincore) and zeros them.
#include "brigade/parallel/sharded_params.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
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
constexpr int64_t kBlock = 50'008;
constexpr int64_t kElements = 3 * kBlock;
constexpr int64_t kPage = 4096;

float parameter(int64_t i) {
  return static_cast<float>(i % 1000) * 0.25f + 1.0f;  // never zero
}

// A real communicator that also records the all-gathers issued through it
// (by where their output starts), in issue order.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& group_name() const override { return inner_.group_name(); }
  int64_t timeout_ms() const override { return inner_.timeout_ms(); }
  std::shared_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    return inner_.all_reduce(data, count, dtype, op);
  }
  std::shared_ptr<Work> reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                                       ReduceOp op) override {
    return inner_.reduce_scatter(input, output, count, dtype, op);
  }
  std::shared_ptr<Work> all_gather(const void* input, void* output, int64_t count,
                                   DType dtype) override {
    gathers.push_back(static_cast<const float*>(output));
    return inner_.all_gather(input, output, count, dtype);
  }
  std::shared_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root) override {
    return inner_.broadcast(data, count, dtype, root);
  }
  std::shared_ptr<Work> barrier() override { return inner_.barrier(); }
  std::shared_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return inner_.send(data, count, dtype, peer, tag);
  }
  std::shared_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return inner_.recv(data, count, dtype, peer, tag);
  }
  void* shared_buffer() override { return inner_.shared_buffer(); }
  int64_t shared_buffer_bytes() const override { return inner_.shared_buffer_bytes(); }

  std::vector<const float*> gathers;

 private:
  Communicator& inner_;
};

// What one rank sees of the buffer.
class View {
 public:
  View(const BucketPlan& plan, const float* params, int rank)
      : plan_(plan), params_(params), rank_(rank) {}

  // Every element of bucket `index` holds the full parameters.
  void expect_gathered(size_t index, const std::string& when) const {
    const FlatRange b = plan_.buckets()[index];
    for (int64_t i = b.begin; i < std::min(b.end, kElements); ++i) {
      require(params_[i] == parameter(i), "{}: bucket {} element {} is {}, expected {}", when,
              index, i, params_[i], parameter(i));
    }
  }
  // This rank's slice of bucket `index` holds its values.
  void expect_owned(size_t index, const std::string& when) const {
    const FlatRange mine = plan_.slice(static_cast<int64_t>(index), rank_);
    for (int64_t i = mine.begin; i < std::min(mine.end, kElements); ++i) {
      require(params_[i] == parameter(i), "{}: bucket {} owned element {} is {}, expected {}", when,
              index, i, params_[i], parameter(i));
    }
  }
  // The rest of a released bucket reads as zeros. Reading released memory
  // brings pages back (the zero page, or a new shm page), so this comes
  // after the last expect_resident.
  void expect_zero_unowned(size_t index, const std::string& when) const {
    const FlatRange b = plan_.buckets()[index];
    const FlatRange mine = plan_.slice(static_cast<int64_t>(index), rank_);
    for (int64_t i = b.begin; i < std::min(b.end, kElements); ++i) {
      if (i >= mine.begin && i < mine.end) continue;
      require(params_[i] == 0.0f, "{}: bucket {} unowned element {} is {}, expected 0", when, index,
              i, params_[i]);
    }
  }
  // Bytes resident in memory (mincore) and their expected range: the owned
  // share plus the unowned parts of `gathered` buckets, give or take the
  // partial pages at slice and bucket edges (four per bucket).
  void expect_resident(const std::vector<size_t>& gathered, const std::string& when) const {
    int64_t floats = plan_.owned_size();
    for (const size_t i : gathered) {
      floats += plan_.buckets()[i].size() - plan_.slice(static_cast<int64_t>(i), rank_).size();
    }
    const int64_t expected = floats * 4;
    const int64_t slack = 4 * kPage * static_cast<int64_t>(plan_.buckets().size());
    const int64_t resident = resident_bytes(params_, params_ + plan_.padded_size());
    require(resident >= expected - slack && resident <= expected + slack,
            "{}: {} bytes resident, expected {} +- {}", when, resident, expected, slack);
  }

 private:
  const BucketPlan& plan_;
  const float* params_;
  int rank_;
};

// Runs body(comm, params) in each of kRanks forked ranks, the parameter
// buffer (plan.padded_size() floats, every rank's copy equal) in the segment
// if `shared`, else on the heap.
void run_ranks(bool shared, const BucketPlan& plan,
               const std::function<void(Communicator&, float*)>& body) {
  testing::run_shm_ranks(kRanks, plan.padded_size(), shared,
                         [&](Communicator& comm, float* params) {
                           for (int64_t i = 0; i < kElements; ++i) params[i] = parameter(i);
                           body(comm, params);
                         });
}

class ShardedParamsTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShardedParamsTest, GathersWhatABlockOverlapsAndReleasesItAfter) {
  // Cuts at the block starts 50,008 and 100,016, rounded down to multiples
  // of 32 (2 ranks x 16 floats), 49,984 and 100,000: buckets (in plan order)
  // [100000, end), [49984, 100000), [0, 49984).
  const BucketPlan plan(kElements, kRanks, std::vector<int64_t>{kBlock, 2 * kBlock});
  ASSERT_EQ(plan.buckets().size(), 3u);
  ASSERT_LT(plan.buckets()[1].begin, kBlock) << "block 0 must straddle into bucket 1";
  ASSERT_LT(plan.buckets()[0].begin, 2 * kBlock) << "block 1 must straddle into bucket 0";
  constexpr size_t kB0 = 2, kB1 = 1, kB2 = 0;  // the bucket starting in block k
  run_ranks(GetParam(), plan, [&](Communicator& comm, float* params) {
    RecordingCommunicator recording(comm);
    const View view(plan, params, comm.rank());
    const auto bucket_start = [&](size_t index) { return params + plan.buckets()[index].begin; };
    ShardedParams sharded(recording, plan, params, GetParam());
    // Memory is measured before any read of released parts (see View).
    view.expect_resident({}, "after construction");
    for (size_t i = 0; i < 3; ++i) view.expect_owned(i, "after construction");
    require(sharded.resident_bytes() == plan.owned_size() * 4,
            "resident_bytes() {} after construction", sharded.resident_bytes());

    // Block 0 overlaps its own bucket and the first floats of block 1's:
    // both are gathered, in plan order (every rank issues the same).
    sharded.acquire(0, kBlock);
    require(recording.gathers == std::vector<const float*>{bucket_start(kB1), bucket_start(kB0)},
            "acquiring block 0 issued {} gathers, expected buckets {} and {} in that order",
            recording.gathers.size(), kB1, kB0);
    view.expect_resident({kB0, kB1}, "block 0 acquired");
    view.expect_gathered(kB0, "block 0 acquired");
    view.expect_gathered(kB1, "block 0 acquired");

    // The next block's prefetch gathers only what is not here yet, and the
    // acquire after it waits for that gather rather than issuing another.
    sharded.prefetch(kBlock, 2 * kBlock);
    require(recording.gathers.size() == 3 && recording.gathers[2] == bucket_start(kB2),
            "prefetching block 1 should gather bucket {} alone, after the first two ({} "
            "gathers)",
            kB2, recording.gathers.size());
    sharded.acquire(kBlock, 2 * kBlock);
    require(recording.gathers.size() == 3, "acquiring the prefetched block 1 gathered again");
    view.expect_gathered(kB2, "block 1 acquired");

    // Block 0's release drops its own bucket; the straddling bucket stays for
    // block 1, which holds it too.
    sharded.release(0, kBlock);
    view.expect_resident({kB1, kB2}, "block 0 released");
    view.expect_owned(kB0, "block 0 released");
    view.expect_gathered(kB1, "block 0 released, block 1 held");
    view.expect_gathered(kB2, "block 0 released, block 1 held");

    sharded.release(kBlock, 2 * kBlock);
    view.expect_resident({}, "all released");
    require(sharded.resident_bytes() == plan.owned_size() * 4,
            "resident_bytes() {} after releasing everything", sharded.resident_bytes());
    // All three buckets were here at once (block 0 held, block 1 prefetched).
    require(sharded.peak_resident_bytes() == plan.padded_size() * 4, "peak {} bytes, expected {}",
            sharded.peak_resident_bytes(), plan.padded_size() * 4);
    for (size_t i = 0; i < 3; ++i) {
      view.expect_owned(i, "all released");
      view.expect_zero_unowned(i, "all released");
    }

    // Gathered again from the owners' slices, the values come back.
    sharded.acquire(2 * kBlock, kElements);
    view.expect_gathered(kB2, "block 2 acquired again");
    sharded.release(2 * kBlock, kElements);
  });
}

TEST_P(ShardedParamsTest, PeakStaysBelowTheWholeWhenBlocksComeOneByOne) {
  const BucketPlan plan(kElements, kRanks, std::vector<int64_t>{kBlock, 2 * kBlock});
  run_ranks(GetParam(), plan, [&](Communicator& comm, float* params) {
    ShardedParams sharded(comm, plan, params, GetParam());
    // Each block alone, as a pass without prefetch would run them.
    for (int64_t k = 0; k < 3; ++k) {
      sharded.acquire(k * kBlock, std::min((k + 1) * kBlock, kElements));
      sharded.release(k * kBlock, std::min((k + 1) * kBlock, kElements));
    }
    // The most ever here: the owned half plus the unowned halves of the two
    // buckets block 0 or block 1 overlaps.
    int64_t largest_pair = 0;
    for (size_t i = 0; i + 1 < plan.buckets().size(); ++i) {
      largest_pair =
          std::max(largest_pair, plan.buckets()[i].size() + plan.buckets()[i + 1].size());
    }
    const int64_t bound = (plan.owned_size() + largest_pair / kRanks) * 4;
    require(sharded.peak_resident_bytes() <= bound && sharded.peak_resident_bytes() > 0,
            "peak {} bytes, expected at most {} (of {})", sharded.peak_resident_bytes(), bound,
            plan.padded_size() * 4);
    const int64_t resident = resident_bytes(params, params + plan.padded_size());
    require(resident <= plan.owned_size() * 4 + 4 * kPage * 3,
            "{} bytes resident after every block was released, owned {}", resident,
            plan.owned_size() * 4);
  });
}

INSTANTIATE_TEST_SUITE_P(Buffer, ShardedParamsTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "shm" : "heap"; });

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

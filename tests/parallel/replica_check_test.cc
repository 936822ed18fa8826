// The replica check's parts (parallel/replica_check.h): one flipped bit
// changes the hash, and the odd replica is found by majority, or, with no
// majority, every replica is named. The check between live ranks, with the
// rank and step in the incident line, runs in tests/cli/sdc_test.cc.
#include "brigade/parallel/replica_check.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace brigade {
namespace BRIGADE_TEST_FILE {

TEST(ReplicaCheck, OneFlippedBitAnywhereChangesTheHash) {
  std::vector<float> params(4099);
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.01f * static_cast<float>(i);
  const uint64_t clean = hash_floats(params.data(), static_cast<int64_t>(params.size()));
  EXPECT_EQ(clean, hash_floats(params.data(), static_cast<int64_t>(params.size())));
  for (size_t at : {size_t{0}, size_t{2048}, params.size() - 1}) {
    for (int bit : {0, 22, 31}) {
      std::vector<float> copy = params;
      uint32_t bits = 0;
      std::memcpy(&bits, &copy[at], 4);
      bits ^= 1u << bit;
      std::memcpy(&copy[at], &bits, 4);
      EXPECT_NE(clean, hash_floats(copy.data(), static_cast<int64_t>(copy.size())))
          << "element " << at << " bit " << bit;
    }
  }
}

// Past one chunk (2^20 floats) the chunks are hashed on the OpenMP threads:
// every chunk counts, and the thread count does not change the hash.
TEST(ReplicaCheck, AChunkedHashCoversEveryChunkWhateverTheThreads) {
  std::vector<float> params((size_t{3} << 20) + 5);
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 977);
  const int64_t n = static_cast<int64_t>(params.size());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const uint64_t one = hash_floats(params.data(), n);
  omp_set_num_threads(2);
  EXPECT_EQ(hash_floats(params.data(), n), one);
  omp_set_num_threads(threads);
  for (size_t at : {size_t{5}, (size_t{1} << 20) + 7, params.size() - 1}) {
    std::vector<float> copy = params;
    copy[at] = -copy[at] - 1.0f;
    EXPECT_NE(hash_floats(copy.data(), n), one) << "element " << at;
  }
  EXPECT_NE(combine_hashes({1, 2}), combine_hashes({2, 1}));
}

TEST(ReplicaCheck, TheOddReplicaIsFoundByMajority) {
  EXPECT_TRUE(odd_replicas({7, 7, 7, 7}).empty());
  EXPECT_TRUE(odd_replicas({7}).empty());
  EXPECT_EQ(odd_replicas({7, 7, 9, 7}), std::vector<int>{2});
  EXPECT_EQ(odd_replicas({9, 7, 7}), std::vector<int>{0});
  // Two odd ones against a larger group still leave a majority.
  EXPECT_EQ(odd_replicas({7, 8, 7, 9, 7}), (std::vector<int>{1, 3}));
}

TEST(ReplicaCheck, WithoutAMajorityEveryReplicaIsNamed) {
  EXPECT_EQ(odd_replicas({7, 9}), (std::vector<int>{0, 1}));
  EXPECT_EQ(odd_replicas({7, 9, 9, 7}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(odd_replicas({1, 2, 3}), (std::vector<int>{0, 1, 2}));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

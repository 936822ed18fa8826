// The replica check's parts (parallel/replica_check.h): one flipped bit
// changes the hash, and the odd replica is found by majority, or, with no
// majority, every replica is named. The check between live ranks, with the
// rank and step in the incident line, runs in tests/cli/sdc_test.cc. And
// the gradient replay's verdict: who is named for which disagreement.
#include "brigade/parallel/replica_check.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
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

// What a snapshot's copy feeds the chunked hash (Trainer::compare_replicas'
// fused hash): each rank's pieces of the buffers, in blocks, with chunks
// cut by the pieces' ends and gaps between them that finish() reads. The
// hashes must be hash_floats' of each buffer, or the replicas' comparison
// would differ from a rank that made its own pass.
TEST(ReplicaCheck, AHashFedByACopysBlocksEqualsTheBuffersOwn) {
  const int64_t n = (int64_t{5} << 20) / 2 + 3;  // 2.5 chunks and a bit
  std::vector<float> params(static_cast<size_t>(n)), moment(4099);
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 1009) * 0.5f;
  for (size_t i = 0; i < moment.size(); ++i) moment[i] = static_cast<float>(i) * 0.25f;
  const uint64_t want_params = hash_floats(params.data(), n);
  const uint64_t want_moment = hash_floats(moment.data(), 4099);
  const auto feed = [](ChunkedHash& h, const float* data, int64_t begin, int64_t end,
                       int64_t block) {
    for (int64_t at = begin; at < end; at += block) {
      h.feed(data + at, static_cast<size_t>(std::min(block, end - at)) * sizeof(float));
    }
  };
  struct Case {
    std::string name;
    std::vector<std::pair<int64_t, int64_t>> pieces;  // of params, fed in this order
  };
  const int64_t chunk = int64_t{1} << 20;
  const std::vector<Case> cases = {
      {"nothing fed", {}},
      {"everything", {{0, n}}},
      {"the second half (a piece starting mid-chunk)", {{n / 2, n}}},
      {"the first half (a chunk left part-fed)", {{0, n / 2}}},
      {"two pieces with a gap", {{0, chunk / 3}, {chunk + 5, 2 * chunk + 9}}},
      {"out of order", {{chunk, n}, {0, chunk}}},
      {"the same bytes twice", {{0, chunk / 2}, {0, chunk}}},
  };
  for (const Case& c : cases) {
    ChunkedHash h;
    h.add(params.data(), n);
    h.add(moment.data(), 4099);
    int64_t fed = 0;
    for (const auto& [begin, end] : c.pieces) {
      feed(h, params.data(), begin, end, 65536 + 3);
      fed += end - begin;
    }
    feed(h, moment.data(), 0, 4099, 1000);
    // Bytes outside every buffer are not hashed.
    const std::vector<float> elsewhere(64, 1.0f);
    h.feed(elsewhere.data(), elsewhere.size() * sizeof(float));
    EXPECT_FALSE(h.finished()) << c.name;
    h.finish();
    ASSERT_TRUE(h.finished()) << c.name;
    ASSERT_EQ(h.hashes().size(), 2u) << c.name;
    EXPECT_EQ(h.hashes()[0], want_params) << c.name;
    EXPECT_EQ(h.hashes()[1], want_moment) << c.name;
    // Something was hashed from the feed, not all left to finish().
    if (c.name == "everything") {
      EXPECT_EQ(h.fed_bytes(), static_cast<int64_t>((n + 4099) * sizeof(float)));
    }
    EXPECT_GT(h.fed_bytes(), 0) << c.name;
    EXPECT_LE(h.fed_bytes(), static_cast<int64_t>((fed + 4099) * sizeof(float))) << c.name;
  }
  // A flip made after a chunk was fed is not seen (the caller must rule that
  // out: Trainer::take_snapshot_hash); one made before is.
  ChunkedHash after, before;
  after.add(params.data(), n);
  before.add(params.data(), n);
  feed(after, params.data(), 0, n, chunk);
  params[7] += 1.0f;
  feed(before, params.data(), 0, n, chunk);
  after.finish();
  before.finish();
  EXPECT_EQ(after.hashes()[0], want_params);
  EXPECT_EQ(before.hashes()[0], hash_floats(params.data(), n));
  EXPECT_NE(before.hashes()[0], want_params);
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

// The gradient replay's verdict from the hashes a group of n ranks would
// compute: `compute(device, data)` is what rank `device` gets for rank
// `data`'s micro-batches (its own: device == data).
template <typename Compute>
GradientReplay replay_verdict(int n, Compute compute) {
  std::vector<uint64_t> own, replayed, thirds;
  for (int r = 0; r < n; ++r) {
    own.push_back(compute(r, r));
    replayed.push_back(compute(r, (r + 1) % n));
  }
  GradientReplay g = gradient_disputes(own, replayed);
  if (g.clean()) return g;
  for (int s = 0; s < n; ++s) thirds.push_back(compute(s, gradient_settling_target(s, n)));
  settle_gradient_disputes(g, thirds);
  return g;
}

TEST(GradientReplay, AgreeingComputationsRaiseNoDispute) {
  for (int n : {2, 3, 5}) {
    EXPECT_TRUE(replay_verdict(n, [](int, int data) { return uint64_t(100 + data); }).clean());
  }
}

// A passing fault in one rank's own gradient: its replayer and the third
// computation agree against it.
TEST(GradientReplay, AFlippedOwnGradientNamesItsRank) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    bool struck = false;
    const GradientReplay g = replay_verdict(n, [&](int device, int data) {
      if (device == 1 && data == 1 && !struck) {
        struck = true;
        return uint64_t{7};
      }
      return uint64_t(100 + data);
    });
    ASSERT_EQ(g.disputes.size(), 1u);
    EXPECT_TRUE(g.disputes[0].own_off && !g.disputes[0].replay_off);
    EXPECT_EQ(g.suspects, std::vector<int>{1});
  }
}

// A passing fault in a replay: the third computation agrees with the
// rank's own gradient, and the replayer is named.
TEST(GradientReplay, AReplayThatWasOffNamesTheReplayer) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    bool struck = false;
    const GradientReplay g = replay_verdict(n, [&](int device, int data) {
      if (device == 0 && data == 1 && !struck) {
        struck = true;
        return uint64_t{7};
      }
      return uint64_t(100 + data);
    });
    ASSERT_EQ(g.disputes.size(), 1u);
    EXPECT_EQ(g.disputes[0].rank, 1);
    EXPECT_TRUE(g.disputes[0].replay_off && !g.disputes[0].own_off);
    EXPECT_EQ(g.suspects, std::vector<int>{0});
  }
}

// A device that computes wrong every time disputes both its own gradient
// and its replay of its peer's. With three ranks or more a rank on neither
// side settles each, and only that device is named; with two nothing can,
// and nobody is named (the caller turns the replay off).
TEST(GradientReplay, ADeviceWrongEveryTimeIsOutvotedWhereAThirdRankExists) {
  for (int n : {3, 4, 5}) {
    for (int bad = 0; bad < n; ++bad) {
      SCOPED_TRACE(std::to_string(n) + " ranks, bad " + std::to_string(bad));
      const GradientReplay g = replay_verdict(n, [&](int device, int data) {
        return uint64_t(100 + data + (device == bad ? 1000 : 0));
      });
      EXPECT_EQ(g.disputes.size(), 2u);
      EXPECT_EQ(g.suspects, std::vector<int>{bad});
    }
  }
  const GradientReplay two = replay_verdict(
      2, [](int device, int data) { return uint64_t(100 + data + (device == 1 ? 1000 : 0)); });
  EXPECT_EQ(two.disputes.size(), 2u);
  EXPECT_TRUE(two.suspects.empty());
}

// Every computation different (non-deterministic kernels): nothing settles.
TEST(GradientReplay, ComputationsThatNeverAgreeSettleNothing) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    uint64_t counter = 0;
    const GradientReplay g = replay_verdict(n, [&](int, int) { return ++counter; });
    EXPECT_EQ(g.disputes.size(), static_cast<size_t>(n));
    EXPECT_TRUE(g.suspects.empty());
    for (const GradientReplay::Dispute& d : g.disputes) EXPECT_FALSE(d.settled());
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// The vocabulary-parallel LM head loss against the whole one: the rows of
// wte split over ranks (threads here) with a vocabulary they do not divide,
// chunks smaller than the batch, the per-row statistics combined the way the
// model does. The losses, the ranks' dx summed, and each rank's dwte rows
// must be the whole kernel's; padding rows get no gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/embedding.h"
#include "brigade/kernels/cpu/lm_head_loss.h"
#include "gradcheck.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

void expect_split_head_matches_whole(int ranks, int64_t chunk_rows) {
  set_num_threads(1);
  const int64_t n = 23, c = 8, v = 67;
  const int64_t vl = (v + ranks - 1) / ranks;
  const auto x = testing::random_vector(n * c, 1);
  const auto wte = testing::random_vector(v * c, 2);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 29 + 5) % v);
  const float scale = 0.25f;

  std::vector<float> losses(n), dx(n * c), dwte(v * c, 0.0f);
  cpu::LmHeadLossArgs whole{x.data(), wte.data(),    targets.data(), n,           c,
                            v,        losses.data(), dx.data(),      dwte.data(), scale};
  whole.chunk_rows = chunk_rows;
  cpu::lm_head_loss(whole);

  // Each rank's (max, sum-exp, target logit) per row, combined in rank order.
  std::barrier<> barrier(ranks);
  std::vector<const float*> published(static_cast<size_t>(ranks));
  const auto combine = [&](int rank, float* stats, int64_t rows) {
    published[static_cast<size_t>(rank)] = stats;
    barrier.arrive_and_wait();
    std::vector<float> out(static_cast<size_t>(3 * rows));
    for (int64_t r = 0; r < rows; ++r) {
      float mx = -std::numeric_limits<float>::infinity(), sum = 0, target = 0;
      for (const float* st : published) mx = std::max(mx, st[3 * r]);
      for (const float* st : published) {
        if (st[3 * r + 1] > 0) sum += st[3 * r + 1] * std::exp(st[3 * r] - mx);
        target += st[3 * r + 2];
      }
      out[3 * r] = mx;
      out[3 * r + 1] = sum;
      out[3 * r + 2] = target;
    }
    barrier.arrive_and_wait();
    std::copy(out.begin(), out.end(), stats);
  };
  std::vector<std::vector<float>> rank_losses(ranks), rank_dx(ranks), rank_dwte(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      const int64_t begin = rank * vl, real = std::clamp<int64_t>(v - begin, 0, vl);
      // This rank's rows; the padding rows hold garbage that must not leak.
      std::vector<float> mine(static_cast<size_t>(vl * c), 3.0f);
      std::copy(wte.begin() + begin * c, wte.begin() + (begin + real) * c, mine.begin());
      rank_losses[rank].assign(n, 0.0f);
      rank_dx[rank].assign(n * c, 0.0f);
      rank_dwte[rank].assign(vl * c, 0.0f);
      cpu::LmHeadLossArgs a{x.data(),
                            mine.data(),
                            targets.data(),
                            n,
                            c,
                            vl,
                            rank_losses[rank].data(),
                            rank_dx[rank].data(),
                            rank_dwte[rank].data(),
                            scale};
      a.chunk_rows = chunk_rows;
      a.vocab_begin = begin;
      a.v_real = real;
      a.combine = [&, rank](float* stats, int64_t rows) { combine(rank, stats, rows); };
      cpu::lm_head_loss(a);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < ranks; ++rank) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(rank_losses[rank][i], losses[i], 1e-5 * std::fabs(losses[i]))
          << ranks << " ranks, rank " << rank << " row " << i;
    }
    const int64_t begin = rank * vl, real = std::clamp<int64_t>(v - begin, 0, vl);
    for (int64_t i = 0; i < vl * c; ++i) {
      const float want = i < real * c ? dwte[begin * c + i] : 0.0f;
      ASSERT_NEAR(rank_dwte[rank][i], want, 1e-6)
          << ranks << " ranks, rank " << rank << " dwte " << i;
    }
  }
  for (int64_t i = 0; i < n * c; ++i) {
    float sum = 0;
    for (int rank = 0; rank < ranks; ++rank) sum += rank_dx[rank][i];
    ASSERT_NEAR(sum, dx[i], 1e-6) << ranks << " ranks, dx " << i;
  }
}

TEST(VocabParallelLmHead, TwoRanksMatchTheWholeHead) {
  expect_split_head_matches_whole(2, 5);
}

TEST(VocabParallelLmHead, FourRanksMatchTheWholeHead) {
  expect_split_head_matches_whole(4, 7);
}

TEST(VocabParallelEmbedding, RanksLookupsSumToTheWholeOne) {
  const int64_t b = 2, t = 5, c = 4, v = 11, ranks = 3, vl = 4;
  const auto wte = testing::random_vector(v * c, 3), wpe = testing::random_vector(t * c, 4);
  const auto dout = testing::random_vector(b * t * c, 5);
  std::vector<int32_t> tokens(b * t);
  for (int64_t i = 0; i < b * t; ++i) tokens[i] = static_cast<int32_t>((i * 7) % v);
  std::vector<float> out(b * t * c), dwte(v * c, 0.0f), dwpe(t * c, 0.0f);
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), b, t, c);
  std::vector<float> sum(b * t * c, 0.0f), part(b * t * c);
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const int64_t begin = rank * vl, real = std::min(vl, v - begin);
    cpu::token_embedding_forward(part.data(), tokens.data(), wte.data() + begin * c, begin, real,
                                 b * t, c);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    std::vector<float> mine(vl * c, 0.0f);
    cpu::token_embedding_backward(mine.data(), dout.data(), tokens.data(), begin, real, b * t, c);
    for (int64_t i = 0; i < vl * c; ++i) {
      ASSERT_EQ(mine[i], i < real * c ? dwte[begin * c + i] : 0.0f) << "rank " << rank << " " << i;
    }
  }
  // The position part once, after the sum; over rows [3, 10) as a
  // sequence-parallel rank holding those rows would add it.
  cpu::position_embedding_add(sum.data(), wpe.data(), 0, 3, t, c);
  cpu::position_embedding_add(sum.data() + 3 * c, wpe.data(), 3, b * t - 3, t, c);
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_FLOAT_EQ(sum[i], out[i]) << i;
  std::vector<float> mine_wpe(t * c, 0.0f);
  cpu::position_embedding_backward(mine_wpe.data(), dout.data(), b, t, c);
  for (size_t i = 0; i < mine_wpe.size(); ++i) ASSERT_FLOAT_EQ(mine_wpe[i], dwpe[i]) << i;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

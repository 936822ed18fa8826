// ZB-H1's split of the LM head (model/gpt.h, set_split_backward): the
// kernel writes dlogits instead of adding dwte, and lm_head_weight_grad
// adds it later. Training under ZB-H1 must equal training under 1F1B bit
// for bit, so the deferred sum must be the fused kernel's exactly: the same
// row chunks, each added to dwte in the same order. Over several chunks,
// with the whole vocabulary and with the vocabulary-parallel path (combine,
// padding rows past v_real).
#include <gtest/gtest.h>

#include <vector>

#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/lm_head_loss.h"
#include "gradcheck.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

// v rows of wte, the first v_real of them real (v_real < v: padding, and the
// vocabulary-parallel combine over one rank that holds the whole of it).
void expect_deferred_equals_fused(int64_t v, int64_t v_real) {
  set_num_threads(1);
  const int64_t n = 10, c = 8, chunk_rows = 3;
  const auto x = testing::random_vector(n * c, 11);
  const auto wte = testing::random_vector(v * c, 12);
  // A gradient already there (an earlier micro-batch's), added to.
  const auto earlier = testing::random_vector(v * c, 13);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 17 + 3) % v_real);
  const auto args = [&](float* losses, float* dx) {
    cpu::LmHeadLossArgs a;
    a.x = x.data();
    a.wte = wte.data();
    a.targets = targets.data();
    a.n = n, a.c = c, a.v = v;
    a.losses = losses;
    a.dx = dx;
    a.loss_scale = 0.125f;
    a.chunk_rows = chunk_rows;
    if (v_real < v) {
      a.v_real = v_real;
      // One rank holds the whole vocabulary: its statistics are already
      // the whole vocabulary's.
      a.combine = [](float*, int64_t) {};
    }
    return a;
  };
  std::vector<float> losses(n), dx(n * c), dwte = earlier;
  cpu::LmHeadLossArgs fused = args(losses.data(), dx.data());
  fused.dwte = dwte.data();
  cpu::lm_head_loss(fused);

  std::vector<float> d_losses(n), d_dx(n * c), d_dwte = earlier, dlogits(n * v);
  cpu::LmHeadLossArgs deferred = args(d_losses.data(), d_dx.data());
  deferred.dlogits = dlogits.data();
  cpu::lm_head_loss(deferred);
  EXPECT_EQ(d_dwte, earlier) << "the deferred pass added to dwte";
  EXPECT_EQ(d_losses, losses);
  EXPECT_EQ(d_dx, dx);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = v_real; j < v; ++j) ASSERT_EQ(dlogits[r * v + j], 0.0f) << "padding";
  }
  cpu::lm_head_weight_grad(d_dwte.data(), dlogits.data(), x.data(), n, c, v, chunk_rows);
  ASSERT_NE(dwte, earlier);
  for (int64_t i = 0; i < v * c; ++i) ASSERT_EQ(d_dwte[i], dwte[i]) << "dwte " << i;
}

TEST(DeferredLmHead, WeightGradientInChunksIsTheFusedKernelsBitForBit) {
  expect_deferred_equals_fused(37, 37);
}

TEST(DeferredLmHead, VocabularyParallelWeightGradientIsTheFusedKernelsBitForBit) {
  expect_deferred_equals_fused(40, 37);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

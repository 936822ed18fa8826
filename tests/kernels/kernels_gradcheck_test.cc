// Every kernel's backward against finite differences of its forward.
#include <gtest/gtest.h>

#include <cstring>

#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/attention.h"
#include "brigade/kernels/cpu/embedding.h"
#include "brigade/kernels/cpu/gelu.h"
#include "brigade/kernels/cpu/layernorm.h"
#include "brigade/kernels/cpu/linear.h"
#include "brigade/kernels/cpu/lm_head_loss.h"
#include "brigade/kernels/cpu/vector_ops.h"
#include "gradcheck.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
using testing::dot;
using testing::expect_gradient_matches;
using testing::random_vector;

TEST(KernelGradcheck, Linear) {
  const int64_t n = 6, in = 5, out = 7;
  auto x = random_vector(n * in, 1), w = random_vector(in * out, 2), b = random_vector(out, 3);
  const auto r = random_vector(n * out, 4);
  std::vector<float> y(n * out);
  auto loss = [&] {
    cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), n, in, out);
    return dot(y, r);
  };
  std::vector<float> dx(n * in), dw(in * out, 0.0f), db(out, 0.0f);
  cpu::linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), n, in, out,
                       false);
  expect_gradient_matches("linear dx", x, dx, loss);
  expect_gradient_matches("linear dw", w, dw, loss);
  expect_gradient_matches("linear db", b, db, loss);
}

TEST(KernelGradcheck, LinearBackwardAccumulates) {
  const int64_t n = 3, in = 4, out = 2;
  auto x = random_vector(n * in, 1), w = random_vector(in * out, 2);
  const auto r = random_vector(n * out, 4);
  std::vector<float> dx1(n * in), dw1(in * out, 0.0f), db1(out, 0.0f);
  cpu::linear_backward(dx1.data(), dw1.data(), db1.data(), r.data(), x.data(), w.data(), n, in, out,
                       false);
  std::vector<float> dx2 = dx1, dw2 = dw1, db2 = db1;
  cpu::linear_backward(dx2.data(), dw2.data(), db2.data(), r.data(), x.data(), w.data(), n, in, out,
                       true);
  for (size_t i = 0; i < dx1.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx1[i]);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw1[i]);
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_FLOAT_EQ(db2[i], 2 * db1[i]);
}

TEST(KernelGradcheck, LayerNorm) {
  const int64_t n = 5, c = 24;
  auto x = random_vector(n * c, 5, 2.0f), w = random_vector(c, 6), b = random_vector(c, 7);
  const auto r = random_vector(n * c, 8);
  std::vector<float> y(n * c), mean(n), rstd(n);
  auto loss = [&] {
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    return dot(y, r);
  };
  loss();
  std::vector<float> dx(n * c, 0.0f), dw(c, 0.0f), db(c, 0.0f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), mean.data(),
                          rstd.data(), w.data(), n, c);
  expect_gradient_matches("layernorm dx", x, dx, loss);
  expect_gradient_matches("layernorm dw", w, dw, loss);
  expect_gradient_matches("layernorm db", b, db, loss);
}

TEST(KernelGradcheck, ResidualLayerNormMatchesAddThenNorm) {
  const int64_t n = 4, c = 16;
  const auto a = random_vector(n * c, 1), d = random_vector(n * c, 2);
  const auto w = random_vector(c, 3), b = random_vector(c, 4);
  std::vector<float> sum(n * c), y1(n * c), y2(n * c), m1(n), r1(n), m2(n), r2(n);
  cpu::residual_layernorm_forward(sum.data(), y1.data(), m1.data(), r1.data(), a.data(), d.data(),
                                  w.data(), b.data(), n, c);
  std::vector<float> added(n * c);
  for (int64_t i = 0; i < n * c; ++i) added[i] = a[i] + d[i];
  cpu::layernorm_forward(y2.data(), m2.data(), r2.data(), added.data(), w.data(), b.data(), n, c);
  for (int64_t i = 0; i < n * c; ++i) {
    EXPECT_EQ(sum[i], added[i]);
    EXPECT_EQ(y1[i], y2[i]);
  }
}

TEST(KernelGradcheck, Gelu) {
  const int64_t n = 200;
  auto x = random_vector(n, 9, 3.0f);
  const auto r = random_vector(n, 10);
  std::vector<float> y(n);
  auto loss = [&] {
    cpu::gelu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  std::vector<float> dx(n);
  cpu::gelu_backward(dx.data(), r.data(), x.data(), n);
  expect_gradient_matches("gelu", x, dx, loss, 1e-3f, 200);
}

TEST(KernelGradcheck, GeluValues) {
  // Against the closed form at a few points, including large |x| where a
  // tanh built from exp could overflow.
  const float xs[] = {-20.0f, -3.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f, 20.0f};
  for (float v : xs) {
    float y;
    cpu::gelu_forward(&y, &v, 1);
    const double expect =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y, expect, 1e-6 * std::max(1.0, std::fabs(expect))) << "x = " << v;
  }
}

TEST(KernelGradcheck, GeluForwardBackwardMatchesTheSeparateKernels) {
  // The backward pass's fused recompute: the activation must equal
  // gelu_forward's and the gradient gelu_backward's, in place over dout as
  // the model calls it, at any n (a length that is not a multiple of the
  // vector width, and one large enough to be split across threads).
  for (const int64_t n : {int64_t{203}, int64_t{1} << 16}) {
    const auto x = random_vector(n, 31, 4.0f);
    const auto dout = random_vector(n, 32);
    std::vector<float> y(n), dx(n), y_fused(n), dx_fused = dout;
    cpu::gelu_forward(y.data(), x.data(), n);
    cpu::gelu_backward(dx.data(), dout.data(), x.data(), n);
    cpu::gelu_forward_backward(y_fused.data(), dx_fused.data(), dx_fused.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(y_fused[i], y[i], 1e-6f * std::max(1.0f, std::fabs(y[i])))
          << "n " << n << " i " << i;
      ASSERT_NEAR(dx_fused[i], dx[i], 1e-6f * std::max(1.0f, std::fabs(dx[i])))
          << "n " << n << " i " << i;
    }
  }
}

// Attention over T that spans several query blocks (the kernel's block is 64
// rows), so both the diagonal-block masking and the off-diagonal blocks count.
TEST(KernelGradcheck, Attention) {
  const int64_t b = 2, t = 70, h = 2, c = 8;
  auto qkv = random_vector(b * t * 3 * c, 11);
  const auto r = random_vector(b * t * c, 12);
  std::vector<float> out(b * t * c), lse(b * h * t);
  auto loss = [&] {
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), b, t, c, h);
    return dot(out, r);
  };
  loss();
  std::vector<float> dqkv(b * t * 3 * c);
  cpu::attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), b, t, c, h);
  expect_gradient_matches("attention dqkv", qkv, dqkv, loss, 1e-2f, 400);
}

TEST(KernelGradcheck, AttentionIsCausal) {
  // Changing a later token's k and v must not change earlier outputs.
  const int64_t b = 1, t = 9, h = 1, c = 4;
  auto qkv = random_vector(b * t * 3 * c, 13);
  std::vector<float> out1(t * c), out2(t * c), lse(t);
  cpu::attention_forward(out1.data(), lse.data(), qkv.data(), b, t, c, h);
  for (int64_t e = c; e < 3 * c; ++e) qkv[(t - 1) * 3 * c + e] += 5.0f;
  cpu::attention_forward(out2.data(), lse.data(), qkv.data(), b, t, c, h);
  for (int64_t i = 0; i < (t - 1) * c; ++i) EXPECT_EQ(out1[i], out2[i]);
  bool last_changed = false;
  for (int64_t i = (t - 1) * c; i < t * c; ++i) last_changed |= out1[i] != out2[i];
  EXPECT_TRUE(last_changed);
}

TEST(KernelGradcheck, Embedding) {
  const int64_t b = 2, t = 5, c = 6, v = 4;
  auto wte = random_vector(v * c, 14), wpe = random_vector(t * c, 15);
  const std::vector<int32_t> tokens = {0, 1, 1, 3, 0, 2, 2, 2, 1, 0};
  const auto r = random_vector(b * t * c, 16);
  std::vector<float> out(b * t * c);
  auto loss = [&] {
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
    return dot(out, r);
  };
  std::vector<float> dwte(v * c, 0.0f), dwpe(t * c, 0.0f);
  cpu::embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), b, t, c);
  expect_gradient_matches("embedding dwte", wte, dwte, loss);
  expect_gradient_matches("embedding dwpe", wpe, dwpe, loss);
}

TEST(KernelGradcheck, LmHeadLossInChunks) {
  // Chunks of 50 rows, so the 120 rows cross two chunk boundaries and end
  // with a short chunk.
  const int64_t n = 120, c = 8, v = 20000, chunk_rows = 50;
  auto x = random_vector(n * c, 17), wte = random_vector(v * c, 18, 0.5f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 7919) % v);
  std::vector<float> losses(n);
  const float scale = 1.0f / static_cast<float>(n);
  auto loss = [&] {
    cpu::LmHeadLossArgs a{x.data(), wte.data(), targets.data(), n, c, v, losses.data()};
    a.chunk_rows = chunk_rows;
    cpu::lm_head_loss(a);
    double s = 0;
    for (float l : losses) s += l;
    return s * scale;
  };
  // The per-row losses against a direct log-softmax.
  loss();
  std::vector<float> logits(v);
  cpu::lm_head_logits(logits.data(), x.data() + 3 * c, wte.data(), 1, c, v);
  double mx = -1e30, sum = 0;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  for (float l : logits) sum += std::exp(l - mx);
  EXPECT_NEAR(losses[3], mx + std::log(sum) - logits[targets[3]], 1e-4);
  // A row in the last, short chunk too.
  cpu::lm_head_logits(logits.data(), x.data() + 110 * c, wte.data(), 1, c, v);
  mx = -1e30;
  sum = 0;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  for (float l : logits) sum += std::exp(l - mx);
  EXPECT_NEAR(losses[110], mx + std::log(sum) - logits[targets[110]], 1e-4);

  std::vector<float> dx(n * c), dwte(v * c, 0.0f);
  cpu::LmHeadLossArgs a{x.data(), wte.data(),    targets.data(), n,           c,
                        v,        losses.data(), dx.data(),      dwte.data(), scale};
  a.chunk_rows = chunk_rows;
  cpu::lm_head_loss(a);
  expect_gradient_matches("lm head dx", x, dx, loss, 1e-2f, 32);
  // dwte is sparse-ish in its large entries; sample the target rows.
  expect_gradient_matches("lm head dwte", wte, dwte, loss, 1e-2f, 32);
}

TEST(KernelGradcheck, LmHeadScratchForTheLargestRowCountServesEverySmallerOne) {
  // The model sizes the logits scratch once for its N rows; evaluation and
  // the last micro-batch may run fewer. GPT-2's vocabulary: chunks of at
  // most 667 rows, split evenly (1024 -> 512 + 512, 667 -> one chunk of 667),
  // never more rows than the scratch holds (ASan sees an overflow).
  const int64_t most = 1024, c = 8, v = 50257;
  const auto x = random_vector(most * c, 51), wte = random_vector(v * c, 52, 0.5f);
  std::vector<int32_t> targets(most);
  for (int64_t i = 0; i < most; ++i) targets[i] = static_cast<int32_t>((i * 7919) % v);
  std::vector<float> scratch(static_cast<size_t>(cpu::lm_head_scratch_floats(most, v)));
  for (int64_t n : {most, int64_t{700}, int64_t{667}, int64_t{300}}) {
    std::vector<float> with_scratch(n), owned(n);
    cpu::LmHeadLossArgs a{x.data(), wte.data(), targets.data(), n, c, v, with_scratch.data()};
    a.scratch = scratch.data();
    cpu::lm_head_loss(a);
    cpu::LmHeadLossArgs b{x.data(), wte.data(), targets.data(), n, c, v, owned.data()};
    cpu::lm_head_loss(b);
    for (int64_t r = 0; r < n; ++r) ASSERT_EQ(with_scratch[r], owned[r]) << n << " rows, row " << r;
  }
}

TEST(KernelGradcheck, LmHeadGradientsMatchADirectSoftmax) {
  // The loss and both gradients against softmax - one-hot written out in
  // double precision, to float rounding: a finite-difference check would
  // miss a gradient off by a percent. 300 rows over the threshold for
  // threads, a vocabulary that is not a multiple of the vector width.
  const int64_t n = 300, c = 8, v = 1001;
  const float scale = 0.25f;
  const auto x = random_vector(n * c, 41), wte = random_vector(v * c, 42, 0.5f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 7919) % v);
  std::vector<float> losses(n), dx(n * c), dwte(v * c, 0.0f);
  cpu::LmHeadLossArgs a{x.data(), wte.data(),    targets.data(), n,           c,
                        v,        losses.data(), dx.data(),      dwte.data(), scale};
  cpu::lm_head_loss(a);
  std::vector<double> want_dx(n * c, 0.0), want_dwte(v * c, 0.0), logit(v);
  for (int64_t r = 0; r < n; ++r) {
    double mx = -1e300, sum = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      logit[j] = 0.0;
      for (int64_t k = 0; k < c; ++k) logit[j] += double{x[r * c + k]} * wte[j * c + k];
      mx = std::max(mx, logit[j]);
    }
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logit[j] - mx);
    EXPECT_NEAR(losses[r], mx + std::log(sum) - logit[targets[r]], 1e-5) << "row " << r;
    for (int64_t j = 0; j < v; ++j) {
      const double d = scale * (std::exp(logit[j] - mx) / sum - (j == targets[r] ? 1.0 : 0.0));
      for (int64_t k = 0; k < c; ++k) {
        want_dx[r * c + k] += d * wte[j * c + k];
        want_dwte[j * c + k] += d * x[r * c + k];
      }
    }
  }
  for (int64_t i = 0; i < n * c; ++i) ASSERT_NEAR(dx[i], want_dx[i], 1e-6) << "dx " << i;
  for (int64_t i = 0; i < v * c; ++i) ASSERT_NEAR(dwte[i], want_dwte[i], 1e-6) << "dwte " << i;
}

TEST(VectorOps, SumOfSquaresIsTheSameForAnyThreadCount) {
  // The gradient norm feeds clipping: if it changed with the thread count or
  // the order threads finish in, resume would not be bit-identical.
  const auto x = random_vector(1 << 20, 21);
  set_num_threads(1);
  const double one = cpu::sum_squares(x.data(), static_cast<int64_t>(x.size()));
  set_num_threads(2);
  for (int rep = 0; rep < 5; ++rep) {
    EXPECT_EQ(cpu::sum_squares(x.data(), static_cast<int64_t>(x.size())), one);
  }
  EXPECT_NEAR(one, dot(x, x), 1e-9 * one);
}

// The replica check's hash under ZeRO 0 (cpu::state_hash): its formula,
// written out here one element at a time, at each instruction-set level
// (the test runs under both); the same on any thread count and as a sum of
// the hashes of any cut of the range, which is what lets the update take
// it block by block wherever its runs are cut.
uint64_t state_hash_by_formula(const std::vector<float>* state, int64_t n, int64_t first) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < 3; ++k) {
      uint32_t x = 0;
      std::memcpy(&x, &state[k][static_cast<size_t>(i)], sizeof(x));
      const uint32_t a = 0x9E3779B1u * static_cast<uint32_t>(3 * (first + i) + k) ^ x;
      sum += static_cast<uint64_t>(a) * (a ^ 0x5BD1E995u);
    }
  }
  return sum;
}

TEST(VectorOps, StateHashIsItsFormulaOnAnyThreadsAndAddsUpOverAnyCut) {
  const int64_t n = 100'003, first = 12'345;
  const std::vector<float> state[3] = {random_vector(n, 1), random_vector(n, 2),
                                       random_vector(n, 3)};
  const auto hash = [&](int64_t begin, int64_t end) {
    return cpu::state_hash(state[0].data() + begin, state[1].data() + begin,
                           state[2].data() + begin, end - begin, first + begin);
  };
  const uint64_t want = state_hash_by_formula(state, n, first);
  set_num_threads(1);
  EXPECT_EQ(hash(0, n), want);
  set_num_threads(2);
  EXPECT_EQ(hash(0, n), want);
  for (const int64_t cut : {int64_t{1}, int64_t{2047}, int64_t{50'001}, n - 1}) {
    EXPECT_EQ(hash(0, cut) + hash(cut, n), want) << "cut at " << cut;
  }
}

TEST(VectorOps, StateHashSeesEveryFlippedBitAndMovedValue) {
  const int64_t n = 48;
  std::vector<float> state[3] = {random_vector(n, 4), random_vector(n, 5), random_vector(n, 6)};
  const auto hash = [&] {
    return cpu::state_hash(state[0].data(), state[1].data(), state[2].data(), n, 7);
  };
  const uint64_t clean = hash();
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      float& value = state[k][static_cast<size_t>(i)];
      for (int bit = 0; bit < 32; ++bit) {
        uint32_t x = 0;
        std::memcpy(&x, &value, sizeof(x));
        x ^= 1u << bit;
        std::memcpy(&value, &x, sizeof(x));
        ASSERT_NE(hash(), clean) << "buffer " << k << ", element " << i << ", bit " << bit;
        x ^= 1u << bit;
        std::memcpy(&value, &x, sizeof(x));
      }
    }
  }
  ASSERT_EQ(hash(), clean);
  std::swap(state[0][3], state[0][30]);
  EXPECT_NE(hash(), clean) << "two parameters swapped";
  std::swap(state[0][3], state[0][30]);
  std::swap(state[1], state[2]);
  EXPECT_NE(hash(), clean) << "the moments swapped";
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// The whole model: gradients by finite differences, recompute equivalence,
// memory that grows linearly with T, and input validation.
#include "brigade/model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

GptConfig tiny_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 12;
  c.vocab_size = 11;
  return c;
}

struct Fixture {
  explicit Fixture(GptConfig config, int64_t b = 2)
      : cfg(config), layout(cfg), params(layout.size()), grads(layout.size()), b(b) {
    init_gpt2_weights(layout, cfg.n_layer, 7, params.data());
    // Non-trivial LayerNorm and bias values, so their gradients are exercised.
    for (const ParamInfo& p : layout.params()) {
      if (p.kind == ParamKind::kNorm || p.kind == ParamKind::kBias) {
        for (int64_t i = 0; i < p.numel; ++i) {
          params.data()[p.offset + i] += 0.1f * Philox::normal2(3, p.offset, i)[0];
        }
      }
    }
    const int64_t t = cfg.block_size;
    for (int64_t i = 0; i < b * t; ++i) {
      inputs.push_back(static_cast<int32_t>(Philox::below(1, 0, i, cfg.vocab_size)));
      targets.push_back(static_cast<int32_t>(Philox::below(1, 1, i, cfg.vocab_size)));
    }
  }
  GptConfig cfg;
  ParamLayout layout;
  FloatBuffer params, grads;
  int64_t b;
  std::vector<int32_t> inputs, targets;
};

TEST(Gpt, GradientsMatchFiniteDifferences) {
  Fixture f(tiny_config());
  const int64_t t = f.cfg.block_size;
  Gpt model(f.cfg, f.params.data(), f.grads.data());
  model.forward_backward(f.inputs.data(), f.targets.data(), f.b, t, 1.0f / (f.b * t));
  // Check a few coordinates of every tensor, against that tensor's scale.
  for (const ParamInfo& p : f.layout.params()) {
    double scale = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(f.grads.data()[p.offset + i])));
    }
    ASSERT_GT(scale, 0) << p.name << " has an all-zero gradient";
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t i = (k * 7919) % p.numel;
      float* x = f.params.data() + p.offset + i;
      const float saved = *x, h = 1e-2f;
      *x = saved + h;
      const double plus = model.forward_loss(f.inputs.data(), f.targets.data(), f.b, t);
      *x = saved - h;
      const double minus = model.forward_loss(f.inputs.data(), f.targets.data(), f.b, t);
      *x = saved;
      const double numeric = (plus - minus) / (2 * h);
      EXPECT_NEAR(f.grads.data()[p.offset + i], numeric, 0.03 * scale + 2e-5)
          << p.name << "[" << i << "]";
    }
  }
}

TEST(Gpt, FullRecomputeGivesIdenticalGradients) {
  GptConfig none = tiny_config();
  GptConfig full = none;
  full.recompute = Recompute::kFull;
  Fixture a(none), b(full);
  const int64_t t = none.block_size;
  Gpt ma(none, a.params.data(), a.grads.data());
  Gpt mb(full, b.params.data(), b.grads.data());
  const float la = ma.forward_backward(a.inputs.data(), a.targets.data(), 2, t, 0.1f);
  const float lb = mb.forward_backward(b.inputs.data(), b.targets.data(), 2, t, 0.1f);
  EXPECT_EQ(la, lb);
  for (int64_t i = 0; i < a.layout.size(); ++i) {
    ASSERT_EQ(a.grads.data()[i], b.grads.data()[i]) << "element " << i;
  }
  EXPECT_LT(mb.activation_bytes(8, 12), ma.activation_bytes(8, 12));
}

TEST(Gpt, GradientsAccumulateAcrossMicroBatches) {
  Fixture f(tiny_config());
  const int64_t t = f.cfg.block_size;
  Gpt model(f.cfg, f.params.data(), f.grads.data());
  model.forward_backward(f.inputs.data(), f.targets.data(), f.b, t, 0.5f);
  std::vector<float> once(f.grads.data(), f.grads.data() + f.grads.size());
  model.forward_backward(f.inputs.data(), f.targets.data(), f.b, t, 0.5f);
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(f.grads.data()[i], 2 * once[i], 1e-6f + 1e-5f * std::fabs(once[i]));
  }
}

TEST(Gpt, LossAgreesWithLogits) {
  Fixture f(tiny_config());
  const int64_t t = f.cfg.block_size, v = f.cfg.vocab_size;
  Gpt model(f.cfg, f.params.data(), nullptr);
  const float loss = model.forward_loss(f.inputs.data(), f.targets.data(), f.b, t);
  std::vector<float> logits(f.b * t * v);
  model.forward_logits(f.inputs.data(), f.b, t, logits.data());
  double total = 0;
  for (int64_t row = 0; row < f.b * t; ++row) {
    const float* l = logits.data() + row * v;
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, static_cast<double>(l[j]));
    for (int64_t j = 0; j < v; ++j) sum += std::exp(l[j] - mx);
    total += mx + std::log(sum) - l[f.targets[row]];
  }
  EXPECT_NEAR(loss, total / (f.b * t), 1e-5);
  // The last-position logits are the last row of each sequence, to float
  // rounding: one row at a time is a different GEMM from all rows at once,
  // and oneDNN may sum it in another order (seen: 7 ulps, where operand
  // alignment differed under ASan). Another row's logits would miss by far
  // more.
  std::vector<float> last(f.b * v);
  model.forward_last_logits(f.inputs.data(), f.b, t, last.data());
  for (int64_t row = 0; row < f.b; ++row) {
    for (int64_t j = 0; j < v; ++j) {
      const float want = logits[(row * t + t - 1) * v + j];
      EXPECT_NEAR(last[row * v + j], want, 1e-6f + 1e-5f * std::fabs(want));
    }
  }
}

TEST(Gpt, ActivationMemoryGrowsLinearlyInSequenceLength) {
  GptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.block_size = 4096;
  c.vocab_size = 50257;
  Gpt model(c, nullptr, nullptr);
  const double at_1k = static_cast<double>(model.activation_bytes(4, 1024));
  const double at_2k = static_cast<double>(model.activation_bytes(4, 2048));
  const double at_4k = static_cast<double>(model.activation_bytes(4, 4096));
  // Linear plus a constant (the LM head's fixed-size logit chunk): each
  // doubling of T adds twice what the one before added. Quadratic storage of
  // (T,T) scores would make that growth ratio about 4, and the whole ratio
  // at_4k / at_1k about 16.
  EXPECT_NEAR((at_4k - at_2k) / (at_2k - at_1k), 2.0, 0.05);
  EXPECT_LT(at_4k / at_1k, 4.05);
}

TEST(Gpt, RejectsTokensOutsideTheVocabulary) {
  Fixture f(tiny_config());
  Gpt model(f.cfg, f.params.data(), f.grads.data());
  f.inputs[5] = static_cast<int32_t>(f.cfg.vocab_size);
  EXPECT_THROW(model.forward_loss(f.inputs.data(), f.targets.data(), f.b, f.cfg.block_size), Error);
}

TEST(Gpt, RejectsSequencesLongerThanTheBlock) {
  Fixture f(tiny_config());
  Gpt model(f.cfg, f.params.data(), f.grads.data());
  std::vector<int32_t> long_input(f.cfg.block_size + 1, 0);
  EXPECT_THROW(model.forward_loss(long_input.data(), long_input.data(), 1, f.cfg.block_size + 1),
               Error);
}

TEST(Gpt, InitialisationFollowsGpt2) {
  GptConfig c = tiny_config();
  c.n_embd = 64;
  ParamLayout layout(c);
  FloatBuffer p1(layout.size()), p2(layout.size());
  init_gpt2_weights(layout, c.n_layer, 5, p1.data());
  init_gpt2_weights(layout, c.n_layer, 5, p2.data());
  for (int64_t i = 0; i < layout.size(); ++i) ASSERT_EQ(p1.data()[i], p2.data()[i]);
  auto stddev = [&](const std::string& name) {
    const ParamInfo* info = layout.find(name);
    double s = 0;
    for (int64_t i = 0; i < info->numel; ++i)
      s += p1.data()[info->offset + i] * p1.data()[info->offset + i];
    return std::sqrt(s / info->numel);
  };
  EXPECT_NEAR(stddev("h.0.attn.c_attn.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.0.mlp.c_proj.weight"), 0.02 / std::sqrt(2.0 * c.n_layer), 0.002);
  EXPECT_EQ(p1.data()[layout.find("h.1.ln_2.weight")->offset], 1.0f);
  EXPECT_EQ(p1.data()[layout.find("h.1.ln_2.bias")->offset], 0.0f);
}

TEST(GptConfig, RejectsShapesThatCannotWork) {
  GptConfig c = tiny_config();
  c.n_head = 3;  // 16 not divisible by 3
  EXPECT_THROW(c.validate(), Error);
  c = tiny_config();
  c.n_layer = 0;
  EXPECT_THROW(c.validate(), Error);
}

TEST(ParamLayout, UsesHuggingFaceNamesAndShapes) {
  GptConfig c = tiny_config();
  ParamLayout layout(c);
  ASSERT_NE(layout.find("h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(layout.find("h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(layout.find("h.0.mlp.c_proj.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(layout.find("wte.weight")->shape, (std::vector<int64_t>{11, 16}));
  EXPECT_EQ(layout.params().size(), 2u + 12u * 2u + 2u);
  // GPT-2 small has 124,439,808 parameters (tied LM head).
  GptConfig small;
  small.n_layer = 12;
  small.n_head = 12;
  small.n_embd = 768;
  small.block_size = 1024;
  small.vocab_size = 50257;
  EXPECT_EQ(small.num_params(), 124439808);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// The planner's closed forms against numbers worked by hand (and against the
// runtime's own parameter and FLOP counts, which must agree with them).
#include "brigade/sim/transformer_formulas.h"

#include <gtest/gtest.h>

#include "brigade/sim/model_presets.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

GptConfig shape(int64_t layers, int64_t heads, int64_t hidden, int64_t vocab, int64_t seq) {
  GptConfig c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = hidden;
  c.vocab_size = vocab;
  c.block_size = seq;
  return c;
}

TEST(TransformerFormulas, ParameterCountOfGpt2SmallIsTheKnownOne) {
  // Block: 12 * 768^2 + 13 * 768 = 7,077,888 + 9,984.
  EXPECT_EQ(block_params(768), 7087872.0);
  // 50257*768 (tokens) + 1024*768 (positions) + 12 blocks + 2*768 (ln_f):
  // 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808, GPT-2 small.
  const GptConfig small = shape(12, 12, 768, 50257, 1024);
  EXPECT_EQ(model_params(small, 1024), 124439808.0);
  EXPECT_EQ(model_params(small, 1024), static_cast<double>(small.num_params()));
}

TEST(TransformerFormulas, PresetsHaveThePublishedSizes) {
  // Narayanan et al. 2021 name GPT-3 "174.6B" and the largest "1008.0B".
  EXPECT_NEAR(model_params(find_model_preset("175b")->model, 2048) / 1e9, 174.6, 0.05);
  EXPECT_NEAR(model_params(find_model_preset("1t")->model, 2048) / 1e9, 1008.0, 0.05);
  EXPECT_NEAR(model_params(find_model_preset("530b")->model, 2048) / 1e9, 529.6, 0.05);
}

TEST(TransformerFormulas, FlopsWorkedByHand) {
  // B=1, s=2, L=1, h=6, V=12. Per token: 72 L h^2 = 2592, 12 L h s = 144,
  // 6 h V = 432: 3168, times 2 tokens = 6336.
  const GptConfig c = shape(1, 2, 6, 12, 2);
  EXPECT_DOUBLE_EQ(model_flops_per_step(c, 2, 1), 6336.0);
  EXPECT_DOUBLE_EQ(model_flops_per_step(c, 2, 1), 2.0 * c.train_flops_per_token(2));
  // Full recompute adds one forward of the block per token, 24 h^2 + 4 s h =
  // 864 + 48 = 912: (3168 + 912) * 2 = 8160.
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(c, 2, 1, PlanRecompute::kFull), 8160.0);
  // Selective adds the score and value products again: 4 B s^2 h L = 96.
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(c, 2, 1, PlanRecompute::kSelective), 6432.0);
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(c, 2, 1, PlanRecompute::kNone), 6336.0);
}

TEST(TransformerFormulas, ActivationMemoryFollowsKorthikanti) {
  // 22B (a 64, h 6144, s 2048), t 8, b 1: sbh = 12,582,912 and
  // 5as/(ht) = 5*64*2048/(6144*8) = 13.333...
  const GptConfig c = shape(48, 64, 6144, 51200, 2048);
  const SystemFeatures f = SystemFeatures::megatron_2021();
  Layout l;
  l.tp = 8;
  const double sbh = 2048.0 * 6144.0;
  // No SP: sbh (10 + 24/8 + 13.333) = 331,350,016.
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), sbh * (10 + 3 + 40.0 / 3.0), 1.0);
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), 331350016.0, 1.0);
  l.sp = true;  // sbh (34/8 + 13.333)
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), sbh * (4.25 + 40.0 / 3.0), 1.0);
  l.recompute = PlanRecompute::kSelective;  // 34 sbh / t
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), 34.0 * sbh / 8.0, 1.0);
  l.recompute = PlanRecompute::kFull;  // the input only, sharded by SP
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), 2.0 * sbh / 8.0, 1.0);
  l.sp = false;
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, f), 2.0 * sbh, 1.0);
  // Fused attention drops the a s^2 term.
  l.recompute = PlanRecompute::kNone;
  EXPECT_NEAR(block_activation_bytes(c, 2048, l, SystemFeatures{}), sbh * 13.0, 1.0);
  // GPT-3's 5as/h = 5*96*2048/12288 = 80 (the paper's figure).
  const GptConfig gpt3 = find_model_preset("175b")->model;
  Layout one;
  EXPECT_NEAR(block_activation_bytes(gpt3, 2048, one, f) / (2048.0 * 12288.0), 34.0 + 80.0, 1e-9);
}

TEST(TransformerFormulas, PipelineBubbleAndInflightMicrobatches) {
  EXPECT_DOUBLE_EQ(bubble_fraction(8, 1, 64), 7.0 / 71.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(8, 3, 64), (7.0 / 3.0) / (64.0 + 7.0 / 3.0));
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 1, 64), 0.0);
  Layout l;
  l.pp = 8;
  EXPECT_DOUBLE_EQ(inflight_microbatches(l, 64), 8.0);
  EXPECT_DOUBLE_EQ(inflight_microbatches(l, 4), 4.0);  // never more than m
  l.vp = 3;                                            // 8 (1 + 7/24)
  EXPECT_DOUBLE_EQ(inflight_microbatches(l, 64), 8.0 * (1.0 + 7.0 / 24.0));
}

TEST(TransformerFormulas, ZeroStagesDivideWhatTheyShard) {
  const SystemFeatures f;  // 2 + 2 + 12 bytes per parameter
  const double p = 1e9;
  const StateBytes z0 = zero_state_bytes(p, 0, 8, f);
  EXPECT_DOUBLE_EQ(z0.total(), 16e9);
  const StateBytes z1 = zero_state_bytes(p, 1, 8, f);
  EXPECT_DOUBLE_EQ(z1.params, 2e9);
  EXPECT_DOUBLE_EQ(z1.grads, 2e9);
  EXPECT_DOUBLE_EQ(z1.optimizer, 1.5e9);
  const StateBytes z2 = zero_state_bytes(p, 2, 8, f);
  EXPECT_DOUBLE_EQ(z2.grads, 0.25e9);
  EXPECT_DOUBLE_EQ(z2.params, 2e9);
  const StateBytes z3 = zero_state_bytes(p, 3, 8, f);
  EXPECT_DOUBLE_EQ(z3.total(), 2e9);  // 16 bytes / 8
}

TEST(TransformerFormulas, StageParametersAddUpToTheModel) {
  // Summed over pipeline stages and tensor-parallel ranks, the shards hold
  // every parameter once, plus the copies: LayerNorms, row-parallel biases,
  // positions and ln_f on every tp rank, and the LM head's copy of the
  // embedding on the last stage.
  const GptConfig c = shape(8, 8, 512, 1000, 256);
  Layout l;
  l.tp = 4;
  l.pp = 4;
  double total = 0;
  for (int stage = 0; stage < 4; ++stage) {
    total += 4 * stage_params_per_gpu(c, 256, l, stage == 0, stage == 3);
  }
  const double h = 512;
  const double copies = 8 * 3 * 6 * h + 3 * 256 * h + 3 * 2 * h + 1000 * h;
  EXPECT_DOUBLE_EQ(total, model_params(c, 256) + copies);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "brigade/optim/adamw.h"
#include "brigade/optim/grad_clip.h"
#include "brigade/optim/lr_schedule.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

TEST(LrSchedule, WarmsUpLinearlyThenFollowsCosineToMin) {
  const LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway through the cosine
  EXPECT_NEAR(s.at(109), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 99.0 / 100.0)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
}

TEST(GradClip, ScaleMatchesTorch) {
  std::vector<float> g = {3.0f, 4.0f};
  const double norm = grad_norm(g.data(), 2);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(clip_scale(norm, 1.0), 1.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0);    // below the threshold: unchanged
  EXPECT_EQ(clip_scale(100.0, 0.0), 1.0);  // max_norm 0: clipping off
}

TEST(AdamW, GradScaleActsAsScaledGradients) {
  AdamWConfig cfg;
  AdamW scaled(cfg, {{0, 3, true}}, 3), plain(cfg, {{0, 3, true}}, 3);
  std::vector<float> p1 = {1, 2, 3}, p2 = p1;
  const std::vector<float> g = {0.4f, -0.2f, 0.1f};
  const std::vector<float> g_half = {0.2f, -0.1f, 0.05f};
  for (int i = 0; i < 3; ++i) {
    scaled.step(p1.data(), g.data(), 0.01, 0.5);
    plain.step(p2.data(), g_half.data(), 0.01);
  }
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(p1[i], p2[i]);
}

TEST(AdamW, MatchesTheFormulaAndDecaysOnlyMarkedRanges) {
  // Two ranges: [0,2) decays, [2,4) does not.
  AdamWConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.99;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.5;
  AdamW opt(cfg, {{0, 2, true}, {2, 4, false}}, 4);
  std::vector<float> p = {1.0f, -2.0f, 1.0f, -2.0f};
  const std::vector<float> g = {0.5f, 0.25f, 0.5f, 0.25f};
  const double lr = 0.1;
  std::vector<double> m(4, 0), v(4, 0), ref(p.begin(), p.end());
  for (int step = 1; step <= 3; ++step) {
    opt.step(p.data(), g.data(), lr);
    for (int i = 0; i < 4; ++i) {
      const double wd = i < 2 ? 0.5 : 0.0;
      ref[i] *= 1 - lr * wd;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(0.9, step));
      const double vhat = v[i] / (1 - std::pow(0.99, step));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], ref[i], 1e-5) << "element " << i;
  EXPECT_NE(p[0], p[2]);  // same gradient, but only element 0 decayed
  EXPECT_EQ(opt.step_count(), 3);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

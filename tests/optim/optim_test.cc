#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
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

// The copies an in-memory snapshot takes from the update (AdamW::step with
// StateCopy): each covered element's new parameter and moments, bit for bit
// what the update stores, nothing outside the covered runs, and the update
// itself bit for bit the one without copies, though the copies cut its
// pieces (here across a decay boundary, into destinations not 16-byte
// aligned, on the OpenMP threads: 200K elements).
TEST(AdamW, CopiesHoldWhatTheUpdateStoresAndChangeNothing) {
  const int64_t n = 200'000;
  const std::vector<DecayRange> ranges = {{0, 120'000, true}, {120'000, n, false}};
  AdamW with(AdamWConfig{}, ranges, n), without(AdamWConfig{}, ranges, n);
  std::vector<float> p1(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p1[i] = 0.01f * static_cast<float>(i % 97 - 48);
    g[i] = 0.001f * static_cast<float>(i % 31 - 15);
  }
  std::vector<float> p2 = p1;
  const float sentinel = -12345.0f;
  // Two runs, [10000, 130000) across the decay boundary and [150000, n),
  // each into buffers offset by one float from their allocation.
  const std::vector<std::pair<int64_t, int64_t>> runs = {{10'000, 130'000}, {150'000, n}};
  std::vector<std::vector<float>> out;
  std::vector<StateCopy> copies;
  for (const auto& [begin, end] : runs) {
    for (int k = 0; k < 3; ++k) out.emplace_back(static_cast<size_t>(end - begin + 1), sentinel);
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    copies.push_back(
        {runs[r].first,
         runs[r].second,
         {out[3 * r].data() + 1, out[3 * r + 1].data() + 1, out[3 * r + 2].data() + 1}});
  }
  for (int step = 0; step < 3; ++step) {
    for (auto& o : out) std::fill(o.begin(), o.end(), sentinel);
    with.step(p1.data(), g.data(), 1e-3, 0.5, copies);
    without.step(p2.data(), g.data(), 1e-3, 0.5);
    ASSERT_EQ(p1, p2) << "step " << step << ": the copies changed the update";
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto [begin, end] = runs[r];
      const float* state[3] = {p1.data() + begin, with.m().data() + begin, with.v().data() + begin};
      for (int k = 0; k < 3; ++k) {
        const std::vector<float>& o = out[3 * r + static_cast<size_t>(k)];
        EXPECT_EQ(o[0], sentinel) << "written before run " << r;
        ASSERT_TRUE(std::equal(o.begin() + 1, o.end(), state[k]))
            << "step " << step << ", run " << r << ", state " << k;
      }
    }
  }
  EXPECT_EQ(std::vector<float>(with.m().data(), with.m().data() + n),
            std::vector<float>(without.m().data(), without.m().data() + n));
}

// The replica check's hash that the update takes of what it writes
// (AdamW::step with a hash): the one AdamW::state_hash reads from memory
// afterwards, however copies cut the update, and the update bit for bit the
// one without it. The last elements belong to no decay range (padding):
// never updated, not hashed.
TEST(AdamW, TheUpdatesHashIsThatOfTheStateItWrote) {
  const int64_t n = 200'000, covered = n - 100;
  const std::vector<DecayRange> ranges = {{0, 120'000, true}, {120'000, covered, false}};
  AdamW with(AdamWConfig{}, ranges, n), without(AdamWConfig{}, ranges, n);
  std::vector<float> p1(n), g(n), copied(3 * 50'000);
  for (int64_t i = 0; i < n; ++i) {
    p1[i] = 0.01f * static_cast<float>(i % 89 - 44);
    g[i] = 0.001f * static_cast<float>(i % 29 - 14);
  }
  std::vector<float> p2 = p1;
  const std::vector<StateCopy> copies = {
      {100'000, 150'000, {copied.data(), copied.data() + 50'000, copied.data() + 100'000}}};
  for (int step = 0; step < 3; ++step) {
    uint64_t by_update = 0, by_plain_update = 0;
    with.step(p1.data(), g.data(), 1e-3, 0.5, copies, &by_update);
    without.step(p2.data(), g.data(), 1e-3, 0.5, {}, &by_plain_update);
    ASSERT_EQ(p1, p2) << "step " << step;
    EXPECT_EQ(by_update, with.state_hash(p1.data())) << "step " << step;
    EXPECT_EQ(by_plain_update, by_update) << "step " << step << ": the copies' cuts changed it";
  }
  const uint64_t before = with.state_hash(p1.data());
  p1[n - 1] += 1.0f;
  EXPECT_EQ(with.state_hash(p1.data()), before) << "padding hashed";
  p1[covered - 1] += 1.0f;
  EXPECT_NE(with.state_hash(p1.data()), before);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

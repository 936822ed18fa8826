// A model cut into parts (pipeline stages, model/gpt.h part_forward): run
// one after another on the same micro-batches, several in flight in reused
// activation slots, the
// parts give the whole model's losses and gradients (the tied wte's two
// gradients summed), and each part draws exactly its tensors of the whole
// model's initialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/core/philox.h"
#include "brigade/model/gpt.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

GptConfig tiny_config() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 37;
  return c;
}

std::vector<int32_t> tokens(const GptConfig& cfg, int64_t n, uint64_t stream) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(static_cast<int32_t>(Philox::below(5, stream, i, cfg.vocab_size)));
  }
  return out;
}

TEST(GptPart, InitialisationIsTheWholeModelsPart) {
  const GptConfig cfg = tiny_config();
  const ParamLayout whole(cfg);
  std::vector<float> all(static_cast<size_t>(whole.size()));
  init_gpt2_weights(whole, cfg.n_layer, 9, all.data());
  for (const LayerRange range : {LayerRange{0, 1}, LayerRange{1, 2}, LayerRange{1, 3}}) {
    const ParamLayout part(cfg, 0, 1, range);
    std::vector<float> mine(static_cast<size_t>(part.size())), want(mine.size());
    init_gpt2_weights(part, cfg.n_layer, 9, mine.data());
    global_to_local(part, whole, all.data(), want.data());
    EXPECT_EQ(mine, want) << "layers [" << range.begin << ", " << range.end << ")";
  }
}

TEST(GptPart, TwoPartsMatchTheWholeModel) {
  const GptConfig cfg = tiny_config();
  const int64_t b = 2, t = cfg.block_size, n = b * t, c = cfg.n_embd, micro = 3;
  const float scale = 1.0f / static_cast<float>(micro * n);
  const ParamLayout whole(cfg);
  std::vector<float> params(static_cast<size_t>(whole.size())), grads(params.size(), 0.0f);
  init_gpt2_weights(whole, cfg.n_layer, 9, params.data());
  Gpt model(cfg, params.data(), grads.data());
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<float> want_losses;
  for (int64_t m = 0; m < micro; ++m) {
    inputs.push_back(tokens(cfg, n, 2 * m));
    targets.push_back(tokens(cfg, n, 2 * m + 1));
    want_losses.push_back(
        model.forward_backward(inputs.back().data(), targets.back().data(), b, t, scale));
  }

  // Layers [0, 1) and [1, 3): the first with the embeddings, the second with
  // the head and its own copy of wte.
  const ParamLayout la(cfg, 0, 1, {0, 1}), lb(cfg, 0, 1, {1, 3});
  ASSERT_TRUE(lb.params()[0].tied_copy);
  ASSERT_FALSE(la.params()[0].tied_copy);
  std::vector<float> pa(static_cast<size_t>(la.size())), pb(static_cast<size_t>(lb.size()));
  std::vector<float> ga(pa.size(), 0.0f), gb(pb.size(), 0.0f);
  global_to_local(la, whole, params.data(), pa.data());
  global_to_local(lb, whole, params.data(), pb.data());
  Gpt a(cfg, pa.data(), ga.data(), nullptr, {0, 1});
  Gpt part_b(cfg, pb.data(), gb.data(), nullptr, {1, 3});
  // 1F1B's order on the first of two stages, F0 F1 B0 F2 B1 B2: two slots,
  // micro-batch m in slot m % 2, so slot 0 is reused.
  std::vector<std::vector<float>> streams(micro, std::vector<float>(static_cast<size_t>(n * c)));
  std::vector<float> losses(micro), dstream(static_cast<size_t>(n * c));
  const auto forward = [&](int64_t m) {
    EXPECT_EQ(
        a.part_forward(m % 2, inputs[m].data(), nullptr, nullptr, scale, streams[m].data(), b, t),
        0.0f);
    losses[m] =
        part_b.part_forward(0, nullptr, streams[m].data(), targets[m].data(), scale, nullptr, b, t);
    part_b.part_backward(0, nullptr, dstream.data());
    streams[m] = dstream;  // now the gradient of micro-batch m's stream
  };
  const auto backward = [&](int64_t m) { a.part_backward(m % 2, streams[m].data(), nullptr); };
  forward(0);
  forward(1);
  backward(0);
  forward(2);
  backward(1);
  backward(2);
  for (int64_t m = 0; m < micro; ++m) {
    EXPECT_NEAR(losses[m], want_losses[m], 1e-6 * want_losses[m]) << "micro-batch " << m;
  }
  // The parts' gradients in the whole model's places, wte's two added.
  std::vector<float> got(grads.size(), 0.0f), from_b(grads.size(), 0.0f);
  local_to_global(la, whole, ga.data(), got.data());
  local_to_global(lb, whole, gb.data(), from_b.data());
  for (size_t i = 0; i < got.size(); ++i) got[i] += from_b[i];
  float largest = 0, worst = 0;
  for (const float g : grads) largest = std::max(largest, std::abs(g));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - grads[i]));
  EXPECT_GT(largest, 0.0f);
  EXPECT_LE(worst, 1e-5f * largest);
}

// ZB-H1's split: every input half first (in the order the gradients flow),
// the weight halves afterwards in the reverse order: the same gradients.
TEST(GptPart, SplitBackwardMatchesTheWholeModel) {
  const GptConfig cfg = tiny_config();
  const int64_t b = 2, t = cfg.block_size, n = b * t, c = cfg.n_embd, micro = 3;
  const float scale = 1.0f / static_cast<float>(micro * n);
  const ParamLayout whole(cfg);
  std::vector<float> params(static_cast<size_t>(whole.size())), grads(params.size(), 0.0f);
  init_gpt2_weights(whole, cfg.n_layer, 9, params.data());
  Gpt model(cfg, params.data(), grads.data());
  std::vector<std::vector<int32_t>> inputs, targets;
  for (int64_t m = 0; m < micro; ++m) {
    inputs.push_back(tokens(cfg, n, 2 * m));
    targets.push_back(tokens(cfg, n, 2 * m + 1));
    model.forward_backward(inputs.back().data(), targets.back().data(), b, t, scale);
  }
  const ParamLayout la(cfg, 0, 1, {0, 2}), lb(cfg, 0, 1, {2, 3});
  std::vector<float> pa(static_cast<size_t>(la.size())), pb(static_cast<size_t>(lb.size()));
  std::vector<float> ga(pa.size(), 0.0f), gb(pb.size(), 0.0f);
  global_to_local(la, whole, params.data(), pa.data());
  global_to_local(lb, whole, params.data(), pb.data());
  Gpt a(cfg, pa.data(), ga.data(), nullptr, {0, 2});
  Gpt part_b(cfg, pb.data(), gb.data(), nullptr, {2, 3});
  std::vector<float> stream(static_cast<size_t>(n * c)), dstream(stream.size());
  int64_t ready_calls = 0;
  a.set_grad_ready_hook([&](int64_t) { ++ready_calls; });
  part_b.set_split_backward(true);  // as the pipeline runs ZB-H1
  for (int64_t m = 0; m < micro; ++m) {
    a.part_forward(m, inputs[m].data(), nullptr, nullptr, scale, stream.data(), b, t);
    part_b.part_forward(m, nullptr, stream.data(), targets[m].data(), scale, nullptr, b, t);
    part_b.part_backward_input(m, nullptr, dstream.data());
    a.part_backward_input(m, dstream.data(), nullptr);
  }
  EXPECT_EQ(ready_calls, 0) << "the input half reported gradients as final";
  for (int64_t m = micro - 1; m >= 0; --m) {
    part_b.part_backward_weight(m);
    a.part_backward_weight(m);
  }
  EXPECT_EQ(ready_calls, micro * 3) << "two blocks and the embeddings, per weight half";
  std::vector<float> got(grads.size(), 0.0f), from_b(grads.size(), 0.0f);
  local_to_global(la, whole, ga.data(), got.data());
  local_to_global(lb, whole, gb.data(), from_b.data());
  for (size_t i = 0; i < got.size(); ++i) got[i] += from_b[i];
  float largest = 0, worst = 0;
  for (const float g : grads) largest = std::max(largest, std::abs(g));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - grads[i]));
  EXPECT_GT(largest, 0.0f);
  EXPECT_LE(worst, 1e-5f * largest);
}

// Under ZB-H1 the head's wte gradient (a (V,C) GEMM over every row) is the
// weight half's, not the forward's (where the rest of the head's backward
// runs): nothing of it before part_backward_weight, then exactly what the
// fused head adds (the same chunked products, replayed: 16 rows in chunks
// of 5), already when the weight half reports offset 0 ready (data
// parallelism reduces wte then); the other gradients as without the
// deferral.
TEST(GptPart, DeferredHeadWeightGradientIsAddedByTheWeightHalfOnly) {
  const GptConfig cfg = tiny_config();
  const int64_t b = 2, t = cfg.block_size, n = b * t, c = cfg.n_embd, micro = 2;
  const float scale = 1.0f / static_cast<float>(micro * n);
  const ParamLayout whole(cfg), lb(cfg, 0, 1, {2, 3});
  std::vector<float> params(static_cast<size_t>(whole.size()));
  init_gpt2_weights(whole, cfg.n_layer, 9, params.data());
  std::vector<float> pb(static_cast<size_t>(lb.size()));
  global_to_local(lb, whole, params.data(), pb.data());
  std::vector<float> deferred(pb.size(), 0.0f), fused(pb.size(), 0.0f);
  Gpt split(cfg, pb.data(), deferred.data(), nullptr, {2, 3});
  Gpt plain(cfg, pb.data(), fused.data(), nullptr, {2, 3});
  split.set_split_backward(true);
  split.set_head_chunk_rows(5);
  plain.set_head_chunk_rows(5);
  const int64_t wte_begin = lb.wte(), wte_end = wte_begin + cfg.vocab_size * c;
  const auto wte_largest = [&](const std::vector<float>& g) {
    float largest = 0;
    for (int64_t i = wte_begin; i < wte_end; ++i) largest = std::max(largest, std::abs(g[i]));
    return largest;
  };
  std::vector<float> stream(static_cast<size_t>(n * c));
  std::vector<float> dstream(stream.size()), dplain(stream.size());
  for (int64_t m = 0; m < micro; ++m) {
    for (size_t i = 0; i < stream.size(); ++i) {
      stream[i] = static_cast<float>(Philox::below(7, m, i, 1000)) / 1000.0f - 0.5f;
    }
    const std::vector<int32_t> target = tokens(cfg, n, 10 + m);
    const float loss =
        split.part_forward(m, nullptr, stream.data(), target.data(), scale, nullptr, b, t);
    EXPECT_EQ(loss,
              plain.part_forward(m, nullptr, stream.data(), target.data(), scale, nullptr, b, t));
    EXPECT_EQ(wte_largest(deferred), 0.0f) << "micro-batch " << m << "'s forward added dwte";
    split.part_backward_input(m, nullptr, dstream.data());
    EXPECT_EQ(wte_largest(deferred), 0.0f) << "micro-batch " << m << "'s input half added dwte";
    plain.part_backward(m, nullptr, dplain.data());
    EXPECT_EQ(dstream, dplain) << "micro-batch " << m;
  }
  // wte as it stood each time offset 0 was reported ready.
  std::vector<float> wte_at_ready;
  int64_t zero_reports = 0;
  split.set_grad_ready_hook([&](int64_t from) {
    if (from != 0) return;
    ++zero_reports;
    wte_at_ready.assign(deferred.begin() + wte_begin, deferred.begin() + wte_end);
  });
  for (int64_t m = 0; m < micro; ++m) split.part_backward_weight(m);
  EXPECT_EQ(zero_reports, micro);
  ASSERT_GT(wte_largest(fused), 0.0f);
  for (int64_t i = wte_begin; i < wte_end; ++i) {
    ASSERT_EQ(deferred[i], fused[i]) << "wte " << i;
    ASSERT_EQ(wte_at_ready[static_cast<size_t>(i - wte_begin)], fused[i])
        << "wte " << i << " was reported ready before its last head gradient";
  }
  float largest = 0, worst = 0;
  for (const float g : fused) largest = std::max(largest, std::abs(g));
  for (size_t i = 0; i < fused.size(); ++i) {
    worst = std::max(worst, std::abs(deferred[i] - fused[i]));
  }
  EXPECT_LE(worst, 1e-5f * largest);
}

// The memory report (and brigade train's estimate) counts what a split
// backward keeps per activation slot between its two halves: each block's
// linear layers' output gradients, N (2C + 7C) floats (the attention and
// MLP projections' N x C, c_fc's N x 4C, c_attn's N x 3C), and with the
// head the micro-batch's dlogits, N x V.
TEST(GptPart, SplitBackwardCountsWhatItKeepsInActivationBytes) {
  const GptConfig cfg = tiny_config();
  const int64_t b = 2, t = cfg.block_size, n = b * t, c = cfg.n_embd;
  const ParamLayout head(cfg, 0, 1, {2, 3}), trunk(cfg, 0, 1, {0, 2});
  std::vector<float> params(static_cast<size_t>(std::max(head.size(), trunk.size())));
  std::vector<float> grads(params.size());
  Gpt with_head(cfg, params.data(), grads.data(), nullptr, {2, 3});
  Gpt without(cfg, params.data(), grads.data(), nullptr, {0, 2});
  const int64_t head_off = with_head.activation_bytes(b, t);
  const int64_t trunk_off = without.activation_bytes(b, t);
  with_head.set_split_backward(true);
  without.set_split_backward(true);
  const auto f = static_cast<int64_t>(sizeof(float));
  const int64_t per_block = n * 9 * c * f;
  EXPECT_EQ(with_head.activation_bytes(b, t) - head_off, per_block + n * cfg.vocab_size * f);
  EXPECT_EQ(without.activation_bytes(b, t) - trunk_off, 2 * per_block);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

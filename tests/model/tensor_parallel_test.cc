// Megatron's split of the blocks against the unsplit model: tp threads, each
// a Gpt over its shards (ParamLayout(config, rank, tp)) joined by an
// in-process TensorParallel, must give the unsplit model's loss, logits and,
// put back together, its gradients; replicated tensors' gradients must
// agree bit for bit across the ranks. The vocabulary (13, or 5) is one tp
// does not divide, so wte's padding rows are exercised: their gradients
// must stay exactly zero. Sequence parallelism (LayerNorms and residuals
// split by token rows) must give the same, its LayerNorm gradients summed
// over the ranks bit-identical everywhere; selective recompute must give
// exactly what keeping everything gives. The layout's boxes and the sharded
// initialisation are checked against the whole model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "brigade/core/threads.h"
#include "brigade/model/gpt.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

// The tp ranks are threads of this process: each call publishes the
// caller's buffer, and every rank sums all of them in rank order, so the
// results are bit-identical everywhere, as a communicator's are.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), barrier_(size), in_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  void all_reduce_sum(int rank, float* data, int64_t count) {
    in_[static_cast<size_t>(rank)] = data;
    barrier_.arrive_and_wait();
    std::vector<float> sum(static_cast<size_t>(count), 0.0f);
    for (int r = 0; r < size_; ++r) {
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += in_[r][i];
    }
    barrier_.arrive_and_wait();  // every rank has read every buffer
    std::copy(sum.begin(), sum.end(), data);
  }
  void all_gather(int rank, const float* in, float* out, int64_t count) {
    in_[static_cast<size_t>(rank)] = in;
    barrier_.arrive_and_wait();
    for (int r = 0; r < size_; ++r) std::copy(in_[r], in_[r] + count, out + r * count);
    barrier_.arrive_and_wait();
  }
  void reduce_scatter_sum(int rank, const float* in, float* out, int64_t count) {
    in_[static_cast<size_t>(rank)] = in;
    barrier_.arrive_and_wait();
    std::vector<float> sum(static_cast<size_t>(count), 0.0f);
    for (int r = 0; r < size_; ++r) {
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += in_[r][rank * count + i];
    }
    barrier_.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), out);
  }

 private:
  int size_;
  std::barrier<> barrier_;
  std::vector<const float*> in_;
};

class ThreadRank final : public TensorParallel {
 public:
  ThreadRank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  void all_reduce_sum(float* data, int64_t count) override {
    group_.all_reduce_sum(rank_, data, count);
  }
  void all_gather(const float* in, float* out, int64_t count) override {
    group_.all_gather(rank_, in, out, count);
  }
  void reduce_scatter_sum(const float* in, float* out, int64_t count) override {
    group_.reduce_scatter_sum(rank_, in, out, count);
  }

 private:
  ThreadGroup& group_;
  int rank_;
};

GptConfig four_head_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 12;
  c.vocab_size = 13;
  return c;
}

// A whole model's parameters with every bias and LayerNorm perturbed, so
// the split bias paths carry values, and one batch.
struct WholeModel {
  explicit WholeModel(const GptConfig& config) : cfg(config), layout(cfg), params(layout.size()) {
    init_gpt2_weights(layout, cfg.n_layer, 7, params.data());
    for (const ParamInfo& p : layout.params()) {
      if (p.kind == ParamKind::kNorm || p.kind == ParamKind::kBias) {
        for (int64_t i = 0; i < p.numel; ++i) {
          params.data()[p.offset + i] += 0.1f * Philox::normal2(3, p.offset, i)[0];
        }
      }
    }
    for (int64_t i = 0; i < b * cfg.block_size; ++i) {
      inputs.push_back(static_cast<int32_t>(Philox::below(1, 0, i, cfg.vocab_size)));
      targets.push_back(static_cast<int32_t>(Philox::below(1, 1, i, cfg.vocab_size)));
    }
  }
  GptConfig cfg;
  ParamLayout layout;
  FloatBuffer params;
  int64_t b = 2;
  std::vector<int32_t> inputs, targets;
};

struct SplitResult {
  std::vector<float> losses;               // per rank
  std::vector<FloatBuffer> grads;          // per rank, local layouts
  std::vector<float> eval_losses;          // forward_loss per rank
  std::vector<std::vector<float>> logits;  // forward_logits per rank, (B,T,V)
};

// Two micro-batches of forward_backward (accumulating), then forward_loss, on tp threads.
SplitResult run_split(const WholeModel& whole, int tp, bool sequence_parallel) {
  SplitResult result;
  result.losses.assign(static_cast<size_t>(tp), 0.0f);
  result.eval_losses.assign(static_cast<size_t>(tp), 0.0f);
  result.grads.resize(static_cast<size_t>(tp));
  result.logits.resize(static_cast<size_t>(tp));
  ThreadGroup group(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      ThreadRank handle(group, r);
      const ParamLayout local(whole.cfg, r, tp);
      FloatBuffer params(local.size()), grads(local.size());
      global_to_local(local, whole.layout, whole.params.data(), params.data());
      Gpt model(whole.cfg, params.data(), grads.data(), &handle);
      model.set_sequence_parallel(sequence_parallel);
      const int64_t t = whole.cfg.block_size;
      const float scale = 1.0f / static_cast<float>(whole.b * t);
      model.forward_backward(whole.inputs.data(), whole.targets.data(), whole.b, t, scale);
      result.losses[static_cast<size_t>(r)] =
          model.forward_backward(whole.inputs.data(), whole.targets.data(), whole.b, t, scale);
      result.eval_losses[static_cast<size_t>(r)] =
          model.forward_loss(whole.inputs.data(), whole.targets.data(), whole.b, t);
      std::vector<float>& logits = result.logits[static_cast<size_t>(r)];
      logits.assign(static_cast<size_t>(whole.b * t * whole.cfg.vocab_size), 0.0f);
      model.forward_logits(whole.inputs.data(), whole.b, t, logits.data());
      result.grads[static_cast<size_t>(r)] = std::move(grads);
    });
  }
  for (std::thread& th : threads) th.join();
  return result;
}

void expect_split_matches_whole(const GptConfig& config, int tp, bool sequence_parallel = false) {
  set_num_threads(1);
  WholeModel whole(config);
  const int64_t t = config.block_size;
  FloatBuffer grads(whole.layout.size());
  FloatBuffer params = FloatBuffer(whole.layout.size());
  std::copy(whole.params.data(), whole.params.data() + whole.layout.size(), params.data());
  Gpt model(config, params.data(), grads.data());
  const float scale = 1.0f / static_cast<float>(whole.b * t);
  model.forward_backward(whole.inputs.data(), whole.targets.data(), whole.b, t, scale);
  const float loss =
      model.forward_backward(whole.inputs.data(), whole.targets.data(), whole.b, t, scale);

  std::vector<float> logits(static_cast<size_t>(whole.b * t * config.vocab_size));
  model.forward_logits(whole.inputs.data(), whole.b, t, logits.data());

  const SplitResult split = run_split(whole, tp, sequence_parallel);
  for (int r = 0; r < tp; ++r) {
    EXPECT_NEAR(split.losses[static_cast<size_t>(r)], loss, 1e-6 * std::fabs(loss)) << "rank " << r;
    EXPECT_NEAR(split.eval_losses[static_cast<size_t>(r)], loss, 1e-6 * std::fabs(loss))
        << "rank " << r;
    for (size_t i = 0; i < logits.size(); ++i) {
      ASSERT_NEAR(split.logits[static_cast<size_t>(r)][i], logits[i], 1e-5)
          << "rank " << r << " logit " << i;
    }
    // wte's padding rows (a vocabulary tp does not divide) get no gradient.
    const ParamLayout local(config, r, tp);
    const float* g = split.grads[static_cast<size_t>(r)].data();
    for (int64_t i = local.vocab_valid() * config.n_embd; i < local.vocab_rows() * config.n_embd;
         ++i) {
      ASSERT_EQ(g[local.wte() + i], 0.0f) << "rank " << r << ": wte padding element " << i;
    }
  }
  // Every rank's gradients, put in their global places.
  std::vector<FloatBuffer> assembled;
  for (int r = 0; r < tp; ++r) {
    assembled.emplace_back(whole.layout.size());
    local_to_global(ParamLayout(config, r, tp), whole.layout,
                    split.grads[static_cast<size_t>(r)].data(), assembled.back().data());
  }
  for (size_t k = 0; k < whole.layout.params().size(); ++k) {
    const ParamInfo& p = whole.layout.params()[k];
    const bool replicated = ParamLayout(config, 0, tp).params()[k].replicated();
    double scale_k = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      scale_k = std::max(scale_k, static_cast<double>(std::fabs(grads.data()[p.offset + i])));
    }
    ASSERT_GT(scale_k, 0) << p.name;
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t at = p.offset + i;
      // A split tensor's element lives on exactly one rank; the others hold
      // zero there, so the sum over ranks is that rank's value.
      float value = 0;
      for (int r = 0; r < tp; ++r) {
        const float mine = assembled[static_cast<size_t>(r)].data()[at];
        if (replicated) {
          ASSERT_EQ(mine, assembled[0].data()[at])
              << p.name << "[" << i << "]: rank " << r << " differs from rank 0";
        }
      }
      if (replicated) {
        value = assembled[0].data()[at];
      } else {
        for (int r = 0; r < tp; ++r) value += assembled[static_cast<size_t>(r)].data()[at];
      }
      ASSERT_NEAR(value, grads.data()[at], 1e-5 * scale_k + 1e-9)
          << "tp " << tp << ": " << p.name << "[" << i << "]";
    }
  }
}

TEST(TensorParallelGpt, TwoRanksMatchTheWholeModel) {
  expect_split_matches_whole(four_head_config(), 2);
}

TEST(TensorParallelGpt, FourRanksMatchTheWholeModel) {
  expect_split_matches_whole(four_head_config(), 4);
}

TEST(TensorParallelGpt, AVocabularyShorterThanTheRanksLeavesOneRankOnlyPadding) {
  GptConfig c = four_head_config();
  c.vocab_size = 5;  // tp 4: rows 0-1, 2-3, 4 (+1 padding), none (2 padding)
  ASSERT_EQ(ParamLayout(c, 3, 4).vocab_valid(), 0);
  expect_split_matches_whole(c, 4);
  expect_split_matches_whole(c, 2);
}

TEST(TensorParallelGpt, FullRecomputeMatchesTheWholeModel) {
  GptConfig c = four_head_config();
  c.recompute = Recompute::kFull;
  expect_split_matches_whole(c, 2);
}

TEST(SequenceParallelGpt, TwoRanksMatchTheWholeModel) {
  expect_split_matches_whole(four_head_config(), 2, true);
}

TEST(SequenceParallelGpt, FourRanksMatchTheWholeModel) {
  expect_split_matches_whole(four_head_config(), 4, true);
}

TEST(SequenceParallelGpt, WithFullAndSelectiveRecomputeMatchesTheWholeModel) {
  GptConfig c = four_head_config();
  c.recompute = Recompute::kFull;
  expect_split_matches_whole(c, 2, true);
  c.recompute = Recompute::kSelective;
  expect_split_matches_whole(c, 4, true);
}

// Tp rank 0 of 2 of four_head_config(), for what it counts, not what it runs.
struct TpRankZero {
  const GptConfig c = four_head_config();
  ThreadGroup group{2};
  ThreadRank handle{group, 0};
  const ParamLayout local{c, 0, 2};
  FloatBuffer params{local.size()}, grads{local.size()};
  Gpt model{c, params.data(), grads.data(), &handle};
};

// ZB-H1's split backward keeps each block's linear layers' output gradients
// from B to W: per tp rank the projections' N x C whole and c_fc's and
// c_attn's 7C/tp columns, for all N rows under sequence parallelism too (a
// weight gradient reads every row), and the head's dlogits over this
// rank's vocabulary rows.
TEST(TensorParallelGpt, SplitBackwardCountsWhatEachTpRankKeeps) {
  TpRankZero rank;
  const GptConfig& c = rank.c;
  Gpt& model = rank.model;
  const int64_t b = 2, t = c.block_size, n = b * t, e = c.n_embd;
  for (const bool sp : {false, true}) {
    model.set_sequence_parallel(sp);
    model.set_split_backward(false);
    const int64_t whole = model.activation_bytes(b, t);
    model.set_split_backward(true);
    const int64_t kept = c.n_layer * n * (2 * e + 7 * e / 2) + n * rank.local.vocab_rows();
    EXPECT_EQ(model.activation_bytes(b, t) - whole, static_cast<int64_t>(sizeof(float)) * kept)
        << "sequence parallel " << sp;
  }
}

TEST(SequenceParallelGpt, HoldsATpthOfTheRowActivations) {
  // The tensors split by rows (LayerNorm in/outputs, residuals) shrink by
  // tp; the column-split ones do already under plain tensor parallelism.
  TpRankZero rank;
  const GptConfig& c = rank.c;
  Gpt& model = rank.model;
  const int64_t b = 2, t = c.block_size, n = b * t, e = c.n_embd;
  const int64_t plain = model.activation_bytes(b, t);
  model.set_sequence_parallel(true);
  const int64_t split = model.activation_bytes(b, t);
  // Per block ln1, resid_mid, ln2 (rows,C) and 4 statistics (rows); the
  // L+1 block inputs, ln_f's output (rows,C) and 2 statistics; dresid
  // (rows,C): rows N, or N/2 under sp, which adds a gathered (N,C), a shard
  // (N/2,C) and 4C of LayerNorm gradients. Each piece is padded to 16 floats.
  const auto r16 = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  const auto row_floats = [&](int64_t rows) {
    return c.n_layer * (3 * r16(rows * e) + 4 * r16(rows)) + (c.n_layer + 1) * r16(rows * e) +
           r16(rows * e) + 2 * r16(rows) + r16(rows * e);
  };
  const int64_t added = r16(n * e) + r16(n / 2 * e) + r16(4 * e);
  EXPECT_EQ(plain - split,
            static_cast<int64_t>(sizeof(float)) * (row_floats(n) - row_floats(n / 2) - added));
  try {
    std::vector<int32_t> tokens(static_cast<size_t>(b * 7), 1);
    model.forward_loss(tokens.data(), tokens.data(), b, 7);
    FAIL() << "a sequence of 7 was split over 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence length 7 is not a multiple of 2"),
              std::string::npos)
        << e.what();
  }
  GptConfig odd = c;
  odd.block_size = 10;
  EXPECT_THROW(odd.validate_sequence_parallel(4), Error);
  EXPECT_NO_THROW(odd.validate_sequence_parallel(2));
}

// Korthikanti et al. 2022 (their Table 2) count one layer's activations as
// sbh(34 + 5as/h) bytes (fp16, dropout masks, the (s,s) softmax kept),
// sbh(10 + 24/t + 5as/(ht)) under tensor parallelism and sbh/t(34 + 5as/h)
// with sequence parallelism too. This model keeps fp32, has no dropout and
// never stores the softmax (fused attention keeps a log-sum-exp per row,
// the a*s*b term below), so per layer in floats it keeps
//   ln1, resid_mid, ln2, the block input (sbh each, split by rows under sp),
//   4 LayerNorm statistics (sb, split by rows under sp),
//   qkv 3sbh/t, the attention output sbh/t, c_fc's output 4sbh/t, lse asb/t:
// no sp: 4sbh + 8sbh/t + 4sb + asb/t (the 4sbh stays whole, as their 10sbh
// does); sp: (12sbh + 4sb + asb)/t, all of it divided by t, as theirs is.
// Selective recompute drops the attention output and lse: sbh/t + asb/t.
TEST(ActivationMemory, PerLayerBytesFollowTheFormulas) {
  const int64_t s = 16, b = 4, h = 64, a = 4;
  for (const int t : {1, 2, 4}) {
    for (const bool sp : {false, true}) {
      for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective}) {
        if (sp && t == 1) continue;
        const auto bytes = [&](int64_t layers) {
          GptConfig c;
          c.n_layer = layers;
          c.n_head = a;
          c.n_embd = h;
          c.block_size = s;
          c.vocab_size = 64;
          c.recompute = recompute;
          ThreadGroup group(t);
          ThreadRank handle(group, 0);
          Gpt model(c, nullptr, nullptr, t > 1 ? &handle : nullptr);
          model.set_sequence_parallel(sp);
          return model.activation_bytes(b, s);
        };
        const int64_t per_layer = bytes(3) - bytes(2);
        int64_t floats = sp ? (12 * s * b * h + 4 * s * b + a * s * b) / t
                            : 4 * s * b * h + 8 * s * b * h / t + 4 * s * b + a * s * b / t;
        if (recompute == Recompute::kSelective) floats -= (s * b * h + a * s * b) / t;
        EXPECT_EQ(per_layer, 4 * floats)
            << "t " << t << " sp " << sp << " recompute " << recompute_name(recompute);
      }
    }
  }
}

TEST(SelectiveRecompute, GivesExactlyWhatKeepingEverythingGives) {
  set_num_threads(1);
  GptConfig c = four_head_config();
  WholeModel whole(c);
  const int64_t t = c.block_size;
  const auto run = [&](Recompute recompute, std::vector<float>& losses) {
    GptConfig cfg = c;
    cfg.recompute = recompute;
    FloatBuffer params(whole.layout.size()), grads(whole.layout.size());
    std::copy(whole.params.data(), whole.params.data() + whole.layout.size(), params.data());
    Gpt model(cfg, params.data(), grads.data());
    for (int i = 0; i < 2; ++i) {
      losses.push_back(
          model.forward_backward(whole.inputs.data(), whole.targets.data(), whole.b, t, 0.01f));
    }
    return std::make_pair(std::move(grads), model.activation_bytes(whole.b, t));
  };
  std::vector<float> kept_losses, selective_losses;
  const auto [kept, kept_bytes] = run(Recompute::kNone, kept_losses);
  const auto [selective, selective_bytes] = run(Recompute::kSelective, selective_losses);
  EXPECT_EQ(kept_losses, selective_losses);
  for (int64_t i = 0; i < whole.layout.size(); ++i) {
    ASSERT_EQ(kept.data()[i], selective.data()[i]) << "gradient element " << i;
  }
  // One attention output (N,C) and lse (B,H,T) kept instead of one per block.
  const auto r16 = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  const int64_t per_block = r16(whole.b * t * c.n_embd) + r16(whole.b * c.n_head * t);
  EXPECT_EQ(kept_bytes - selective_bytes,
            static_cast<int64_t>(sizeof(float)) * (c.n_layer - 1) * per_block);
}

TEST(TensorParallelLayout, ShardsTileEveryTensorOnce) {
  const GptConfig c = four_head_config();
  const ParamLayout whole(c);
  for (const int tp : {2, 4}) {
    std::vector<int> covered(static_cast<size_t>(whole.size()), 0);
    for (int r = 0; r < tp; ++r) {
      const ParamLayout local(c, r, tp);
      EXPECT_EQ(local.tp_rank(), r);
      for (size_t k = 0; k < local.params().size(); ++k) {
        const ParamInfo& p = local.params()[k];
        EXPECT_EQ(p.global_shape, whole.params()[k].shape) << p.name;
        if (p.replicated() && r > 0) continue;  // counted once, on rank 0
        p.for_each_run([&](int64_t, int64_t global, int64_t count) {
          for (int64_t i = 0; i < count; ++i) {
            ++covered[static_cast<size_t>(whole.params()[k].offset + global + i)];
          }
        });
      }
    }
    for (const ParamInfo& p : whole.params()) {
      for (int64_t i = 0; i < p.numel; ++i) {
        ASSERT_EQ(covered[static_cast<size_t>(p.offset + i)], 1)
            << "tp " << tp << ": " << p.name << "[" << i << "]";
      }
    }
  }
  // Rank 1 of 2 owns heads 2 and 3: columns 16..31 of q, 48..63 of k, 80..95 of v.
  const ParamLayout rank1(c, 1, 2);
  const ParamInfo* qkv = rank1.find("h.0.attn.c_attn.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(qkv->part_offsets, (std::vector<int64_t>{16, 48, 80}));
  const ParamInfo* proj = rank1.find("h.0.mlp.c_proj.weight");
  EXPECT_EQ(proj->shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(proj->part_offsets, (std::vector<int64_t>{64}));
  EXPECT_TRUE(rank1.find("h.0.mlp.c_proj.bias")->replicated());
  // Vocabulary-parallel wte: 13 rows over 4 ranks are 4 each, the last rank
  // holding token 12 and three padding rows, which no run covers.
  const ParamLayout last(c, 3, 4);
  const ParamInfo* wte = last.find("wte.weight");
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(wte->global_shape, (std::vector<int64_t>{13, 32}));
  EXPECT_EQ(wte->part_offsets, (std::vector<int64_t>{12}));
  EXPECT_EQ(last.vocab_begin(), 12);
  EXPECT_EQ(last.vocab_valid(), 1);
  int64_t covered_elements = 0;
  wte->for_each_run([&](int64_t, int64_t, int64_t count) { covered_elements += count; });
  EXPECT_EQ(covered_elements, 32);
}

TEST(TensorParallelLayout, ShardedInitialisationIsTheWholeModelsPart) {
  const GptConfig c = four_head_config();
  const ParamLayout whole(c);
  FloatBuffer expected(whole.size());
  init_gpt2_weights(whole, c.n_layer, 5, expected.data());
  for (int r = 0; r < 2; ++r) {
    const ParamLayout local(c, r, 2);
    FloatBuffer mine(local.size()), want(local.size());
    init_gpt2_weights(local, c.n_layer, 5, mine.data());
    global_to_local(local, whole, expected.data(), want.data());
    for (int64_t i = 0; i < local.size(); ++i) {
      ASSERT_EQ(mine.data()[i], want.data()[i]) << "rank " << r << " element " << i;
    }
  }
}

TEST(TensorParallelLayout, RejectsATpThatDoesNotDivideTheHeads) {
  GptConfig c = four_head_config();  // 4 heads, n_embd 32
  try {
    ParamLayout layout(c, 0, 3);
    FAIL() << "tp 3 of 4 heads was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parallel.tp = 3"), std::string::npos) << message;
    EXPECT_NE(message.find("model.n_head = 4"), std::string::npos) << message;
  }
  c.n_head = 8;  // 8 heads of 4: tp 8 divides heads and n_embd
  EXPECT_NO_THROW(c.validate_tensor_parallel(8));
  c.n_head = 2;
  EXPECT_THROW(c.validate_tensor_parallel(4), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

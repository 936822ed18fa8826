// Tensor parallelism on a dp x tp mesh against a single process: forked
// ranks over the shm backend, grouped as parallel/mesh.h says (tp ranks
// consecutive), training one global batch must give the single process's
// loss at every step and, through the checkpoint they save (loaded whole by
// one process), its parameters. Checkpoints are global: one saved at
// dp 2 x tp 2 continues under tp 1, tp 4 and dp 4 as the uninterrupted run
// does, and reloaded and saved again at once under another layout it holds
// bit for bit the same tensors (what `brigade ckpt hash` hashes).
//
// Every run, the reference too, happens in a forked child: OpenMP's thread
// pool does not survive a fork, so the parent never trains itself.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/parallel/mesh.h"
#include "brigade/parallel/tensor_parallel_group.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "train/mesh_training.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int kSteps = 12;
constexpr int64_t kMicroBatch = 2;
constexpr int64_t kGradAccum = 2;

// Four heads, so tp 4 divides them; 24 wide, so nothing is a power of two.
GptConfig model_config() {
  Config c = Config::from_string(R"(
    [model]
    n_layer = 2
    n_head = 4
    n_embd = 24
    block_size = 16
    vocab_size = 67
  )");
  return GptConfig::from_config(c);
}

struct Layout {
  int dp = 1, tp = 1, zero = 0;
  bool sequence_parallel = false;
  std::string name() const {
    return fmt::format("dp{}_tp{}_zero{}{}", dp, tp, zero, sequence_parallel ? "_sp" : "");
  }
};

TrainOptions options_for(const Layout& layout, int64_t grad_accum, const fs::path& run_dir) {
  TrainOptions o = testing::short_run(kMicroBatch, grad_accum, kSteps, /*warmup_steps=*/3,
                                      /*seed=*/11, run_dir);
  o.parallel.dp = layout.dp;
  o.parallel.tp = layout.tp;
  o.parallel.zero = layout.zero;
  o.parallel.sequence_parallel = layout.sequence_parallel;
  return o;
}

using testing::checkpoint_of;
using testing::GlobalState;
using testing::read_losses;

GlobalState read_checkpoint(const fs::path& step_dir) {
  return testing::read_global_state(step_dir, model_config());
}

// Trains a layout from `resume` (or from scratch) until step `until`, then
// saves; rank 0 writes each step's loss to <dir>/losses.txt. The
// checkpoint is <dir>/run/checkpoints/step_<until>.
void train_forked(const Layout& layout, int64_t grad_accum, const fs::path& dir, int until,
                  const fs::path& resume = {}) {
  const GptConfig model = model_config();
  const int world_size = layout.dp * layout.tp;
  const std::string prefix =
      fmt::format("/brigade-tp-test-{}-{}", ::getpid(), dir.filename().string());
  const auto pids = testing::fork_ranks(world_size, [&](int rank) {
    const testing::MeshGroups groups =
        testing::join_mesh(layout.dp, layout.tp, 1, rank, prefix, shared_bytes_for_training(model));
    TrainOptions options = options_for(layout, grad_accum, dir / "run");
    options.resume = resume.string();
    Trainer trainer(model, options, groups.view());
    if (layout.sequence_parallel) {
      // The trainer's model really splits the rows: fewer activation bytes
      // than the same tp split without sequence parallelism.
      TensorParallelGroup handle(*groups.tp);
      const Gpt plain(model, nullptr, nullptr, &handle);
      testing::require(
          trainer.memory().activations < plain.activation_bytes(kMicroBatch, model.block_size),
          "sequence parallelism did not shrink the activations");
    }
    std::ofstream losses;
    if (rank == 0) losses.open(dir / "losses.txt");
    while (trainer.step() < until) {
      const StepMetrics m = trainer.train_step();
      testing::require(layout.tp == 1 || m.tp_comm_ms > 0,
                       "step {}: tensor parallelism reported no tp communication time", m.step);
      if (rank == 0) losses << fmt::format("{} {:.9e}\n", m.step, m.loss);
    }
    trainer.save_checkpoint();
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(120));
  for (size_t r = 0; r < codes.size(); ++r)
    ASSERT_EQ(codes[r], 0) << layout.name() << " rank " << r;
}

void expect_same_training(const fs::path& reference, const fs::path& run, int step,
                          const std::string& what) {
  testing::expect_same_training(reference, run, step, what, model_config());
}

class TensorParallelTraining : public ::testing::Test {
 protected:
  // One process running every micro-batch of each global batch of `dp` ranks.
  fs::path reference(int dp, int until = kSteps) {
    const fs::path dir = temp_.path() / fmt::format("reference_dp{}_{}", dp, until);
    if (!fs::exists(dir / "losses.txt")) {
      fs::create_directories(dir);
      train_forked({}, kGradAccum * dp, dir, until);
    }
    return dir;
  }
  testing::TempDir temp_{"brigade_tp_test"};
};

TEST_F(TensorParallelTraining, Tp2MatchesOneProcess) {
  // dp 1: each step is kGradAccum micro-batches, as the dp-1 reference's.
  const fs::path dir = temp_.path() / "tp2";
  fs::create_directories(dir);
  train_forked({1, 2, 0}, kGradAccum, dir, kSteps);
  expect_same_training(reference(1), dir, kSteps, "tp 2");
}

TEST_F(TensorParallelTraining, Tp4MatchesOneProcess) {
  const fs::path dir = temp_.path() / "tp4";
  fs::create_directories(dir);
  train_forked({1, 4, 0}, kGradAccum, dir, kSteps);
  expect_same_training(reference(1), dir, kSteps, "tp 4");
}

TEST_F(TensorParallelTraining, Dp2Tp2WithEveryZeroStageMatchesOneProcess) {
  for (const int zero : {0, 1, 2, 3}) {
    const Layout layout{2, 2, zero};
    const fs::path dir = temp_.path() / layout.name();
    fs::create_directories(dir);
    train_forked(layout, kGradAccum, dir, kSteps);
    expect_same_training(reference(2), dir, kSteps, layout.name());
  }
}

TEST_F(TensorParallelTraining, SequenceParallelMatchesOneProcess) {
  // Plain tp equals one process (above); so must sequence parallelism, its
  // LayerNorm gradients summed over tp and counted once in the clipping norm.
  for (const Layout layout :
       {Layout{1, 4, 0, true}, Layout{2, 2, 1, true}, Layout{2, 2, 3, true}}) {
    const fs::path dir = temp_.path() / layout.name();
    fs::create_directories(dir);
    train_forked(layout, kGradAccum, dir, kSteps);
    expect_same_training(reference(layout.dp), dir, kSteps, layout.name());
  }
}

TEST_F(TensorParallelTraining, PaddedVocabularyCheckpointRoundTripsThroughTp1) {
  // 67 tokens over tp 4 are 17 rows a rank, one of them padding; the
  // checkpoint holds the 67 real rows. Reloaded under tp 1 and saved at
  // once, then that under tp 2 (34 rows a rank, one padding): the same
  // tensors, bit for bit, each time (what `brigade ckpt hash` hashes).
  constexpr int kHalf = kSteps / 2;
  const fs::path saved = temp_.path() / "saved_tp4";
  fs::create_directories(saved);
  train_forked({1, 4, 0}, kGradAccum, saved, kHalf);
  const GlobalState original = read_checkpoint(checkpoint_of(saved, kHalf));
  fs::path from = checkpoint_of(saved, kHalf);
  for (const Layout layout : {Layout{1, 1, 0}, Layout{1, 2, 0, true}}) {
    const fs::path dir = temp_.path() / ("resaved_" + layout.name());
    fs::create_directories(dir);
    train_forked(layout, kGradAccum, dir, kHalf, from);
    const GlobalState again = read_checkpoint(checkpoint_of(dir, kHalf));
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(original.kinds[k].size(), again.kinds[k].size());
      for (size_t i = 0; i < original.kinds[k].size(); ++i) {
        ASSERT_EQ(original.kinds[k][i], again.kinds[k][i])
            << layout.name() << ": state " << k << " element " << i;
      }
    }
    from = checkpoint_of(dir, kHalf);
  }
}

TEST_F(TensorParallelTraining, CheckpointFromDp2Tp2ContinuesUnderOtherLayouts) {
  constexpr int kHalf = kSteps / 2;
  const fs::path saved = temp_.path() / "saved_dp2_tp2";
  fs::create_directories(saved);
  train_forked({2, 2, 1}, kGradAccum, saved, kHalf);
  const fs::path checkpoint = checkpoint_of(saved, kHalf);
  // The same global batch of 2 * kGradAccum micro-batches under each layout.
  const struct {
    Layout layout;
    int64_t grad_accum;
  } continuations[] = {
      {{1, 1, 0}, 2 * kGradAccum}, {{1, 4, 0}, 2 * kGradAccum}, {{4, 1, 3}, kGradAccum / 2}};
  for (const auto& c : continuations) {
    const fs::path dir = temp_.path() / ("continued_" + c.layout.name());
    fs::create_directories(dir);
    train_forked(c.layout, c.grad_accum, dir, kSteps, checkpoint);
    expect_same_training(reference(2), dir, kSteps, "continued under " + c.layout.name());
  }
  // Loaded under dp 4 x tp 1 and saved again at once: the same tensors, bit
  // for bit, as dp 2 x tp 2 saved.
  const fs::path again = temp_.path() / "resaved_dp4";
  fs::create_directories(again);
  train_forked({4, 1, 1}, kGradAccum / 2, again, kHalf, checkpoint);
  const GlobalState a = read_checkpoint(checkpoint);
  const GlobalState b = read_checkpoint(checkpoint_of(again, kHalf));
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(a.kinds[k].size(), b.kinds[k].size());
    for (size_t i = 0; i < a.kinds[k].size(); ++i) {
      ASSERT_EQ(a.kinds[k][i], b.kinds[k][i]) << "state " << k << " element " << i;
    }
  }
}

TEST(TensorParallelTrainer, RefusesTpWithoutItsGroups) {
  TrainOptions options = options_for({1, 2, 0}, 1, "unused");
  try {
    Trainer trainer(model_config(), options);
    FAIL() << "tp 2 without a tp group was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 2"), std::string::npos) << e.what();
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

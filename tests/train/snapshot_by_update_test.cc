// In-memory snapshots written by the update (Trainer::claim_snapshot) under
// data parallelism, two shm ranks: ZeRO 0, where every rank updates the
// whole buffer and writes only its own slices into its snapshot (the update
// cut where they begin and end), and ZeRO 1 (compact moment slices). Each
// snapshot must hold its step's parameters and moments bit for bit (a
// staged checkpoint of the same step is the reference), the updates must
// have written most of them, and the run's parameters must be bit for bit
// those of a run without snapshots.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/core/config.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/saved_states.h"
#include "testing/shm_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int64_t kSteps = 6;

// 1.6M parameters: two of the replica hash's chunks, cut by the ranks' slices.
GptConfig model_config() {
  Config c = Config::from_string(
      "[model]\nn_layer = 2\nn_head = 2\nn_embd = 256\nblock_size = 2\nvocab_size = 31\n");
  return GptConfig::from_config(c);
}

TrainOptions options(const fs::path& dir, int zero, bool snapshots) {
  TrainOptions o;
  o.micro_batch = 1;
  o.grad_accum = 1;
  o.steps = 20;
  o.seed = 7;
  o.threads = 1;  // forked ranks: an OpenMP team in the parent would hang the children
  o.run_dir = (dir / (snapshots ? "run" : "reference")).string();
  o.data.synthetic = true;
  o.parallel.dp = 2;
  o.parallel.zero = zero;
  o.parallel.timeout_s = 60;
  if (snapshots) {
    o.snapshot_every = 1;
    o.snapshot_dir = (dir / "area").string();
  }
  return o;
}

void check_zero(int zero) {
  const GptConfig model = model_config();
  testing::TempDir dir("snapshot_by_update");
  fs::create_directories(dir.path() / "area");
  // Without snapshots: the parameters every run must end with.
  testing::run_shm_ranks(2, 0, false, [&](Communicator& comm, float*) {
    Trainer t(model, options(dir.path(), zero, false), &comm);
    for (int64_t s = 0; s < kSteps; ++s) t.train_step();
    t.save_checkpoint();
  });
  testing::run_shm_ranks(2, 0, false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    Trainer t(model, options(dir.path(), zero, true), &comm);
    testing::require(t.snapshots_enabled(), "rank {} has no snapshots", rank);
    int written_by_update = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      t.train_step();
      const fs::path checkpoint = t.save_checkpoint();  // staged: the step as it is
      t.start_snapshot();
      // Bounded by time, not by a count of polls: a loaded machine slows the
      // writer, not the polls. Each poll is a collective that both ranks
      // agree on, so they leave the loop together unless one runs out.
      std::optional<AsyncCheckpointWriter::Stats> stats;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (!stats && t.snapshots_enabled() && std::chrono::steady_clock::now() < deadline) {
        stats = t.poll_snapshot();
      }
      testing::require(stats.has_value(), "rank {}: the snapshot of step {} never settled", rank,
                       step);
      written_by_update += stats->prewritten ? 1 : 0;
      if (rank != 0) continue;
      const fs::path snapshot = dir.path() / "area" / fmt::format("step_{:08d}", step);
      verify_checkpoint(checkpoint);  // with its checksums
      const auto differs = testing::first_differing_state(model, checkpoint, snapshot);
      testing::require(!differs, "ZeRO {}, step {}, state kind {} ({}): the snapshot differs", zero,
                       step, differs ? static_cast<int>(*differs) : -1,
                       stats->prewritten ? "written by the update" : "copied");
    }
    // Two snapshots kept (the replica checks are on) and one being
    // written: the first spare is there once the third committed.
    testing::require(written_by_update >= 3, "ZeRO {}, rank {}: {} snapshots written by the update",
                     zero, rank, written_by_update);
  });
  if (::testing::Test::HasFailure()) return;
  const fs::path with = dir.path() / "run" / "checkpoints" / fmt::format("step_{:08d}", kSteps);
  const fs::path without =
      dir.path() / "reference" / "checkpoints" / fmt::format("step_{:08d}", kSteps);
  const auto differs = testing::first_differing_state(model, with, without);
  EXPECT_FALSE(differs) << "ZeRO " << zero << ", state kind " << static_cast<int>(*differs)
                        << ": snapshots changed the training";
}

TEST(SnapshotByUpdate, UnderZero0EachRanksSlicesHoldTheStepAndTrainingIsUnchanged) {
  check_zero(0);
}

TEST(SnapshotByUpdate, UnderZero1TheCompactMomentsHoldTheStepAndTrainingIsUnchanged) {
  check_zero(1);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

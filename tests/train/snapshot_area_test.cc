// In-memory snapshots need every rank's area (elastic/snapshots.h): a node
// whose launcher could not set one up gives its workers none while the
// other nodes' workers have theirs. The ranks must still agree, through
// the same collective, that there are no snapshots: a collective run by
// some ranks only would hang or pair with the next one (the gradients').
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "brigade/core/config.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

TEST(SnapshotArea, ARankWithoutAnAreaTurnsSnapshotsOffForEveryRank) {
  Config c = Config::from_string(
      "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 31\n");
  const GptConfig model = GptConfig::from_config(c);
  testing::TempDir dir("snapshot_area");
  fs::create_directories(dir.path() / "area");
  testing::run_shm_ranks(2, 0, false, [&](Communicator& comm, float*) {
    TrainOptions o;
    o.micro_batch = 2;
    o.grad_accum = 1;
    o.steps = 2;
    o.seed = 3;
    o.threads = 1;
    o.run_dir = (dir.path() / "run").string();
    o.data.synthetic = true;
    o.parallel.dp = 2;
    o.parallel.timeout_s = 20;
    o.snapshot_every = 1;
    // Rank 1's node has no area.
    if (comm.rank() == 0) o.snapshot_dir = (dir.path() / "area").string();
    Trainer trainer(model, o, &comm);
    testing::require(!trainer.snapshots_enabled(), "rank {} has snapshots on", comm.rank());
    trainer.train_step();
    trainer.train_step();
    testing::require(trainer.step() == 2, "rank {} at step {}", comm.rank(), trainer.step());
  });
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

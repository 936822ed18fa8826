// The replica check does not make a pass of its own over a state another
// pass already saw (Trainer::compare_replicas): under ZeRO 0 it takes the
// hash of parameters and moments that the update writing them took
// (cpu::state_hash, AdamW::step), under ZeRO 1 the hash of the parameters
// that an in-memory snapshot's copy took (take_snapshot_hash). Either must
// be the very hash a pass of the check's own computes over the state
// before the update; and where the state changed after it was taken (a
// flip at the start of the forward), the check must make its own pass and
// see the flip.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "brigade/core/config.h"
#include "brigade/parallel/replica_check.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

struct Seen {
  bool fused = false;
  uint64_t mine = 0;      // this rank's hash in the comparison
  uint64_t own_pass = 0;  // the same state hashed here
  bool clean = false;
};

void check_zero(int zero) {
  // 1.6M parameters: two of the hash's chunks, cut by the ranks' slices.
  Config c = Config::from_string(
      "[model]\nn_layer = 2\nn_head = 2\nn_embd = 256\nblock_size = 2\nvocab_size = 31\n");
  const GptConfig model = GptConfig::from_config(c);
  testing::TempDir dir("snapshot_hash");
  fs::create_directories(dir.path() / "area");
  testing::run_shm_ranks(2, 0, false, [&](Communicator& comm, float*) {
    TrainOptions o;
    o.micro_batch = 1;
    o.grad_accum = 1;
    o.steps = 20;
    o.seed = 5;
    o.threads = 1;
    o.run_dir = (dir.path() / "run").string();
    o.data.synthetic = true;
    o.parallel.dp = 2;
    o.parallel.zero = zero;
    o.parallel.timeout_s = 60;
    o.sdc_every = 1000;  // checks on; due here after every snapshot
    o.snapshot_every = 1;
    o.snapshot_dir = (dir.path() / "area").string();
    Trainer t(model, o, &comm);
    testing::require(t.snapshots_enabled(), "rank {} has no snapshots", comm.rank());
    std::vector<Seen> seen;
    t.on_before_update(
        [&] {
          const ReplicaComparison r = t.compare_replicas();
          const uint64_t own = zero == 0 ? t.optimizer().state_hash(t.params().data())
                                         : hash_floats(t.params().data(), t.params().size());
          seen.push_back({r.fused, r.hashes[static_cast<size_t>(comm.rank())], own, r.clean()});
        },
        [](int64_t) { return true; });
    t.train_step();  // no snapshot before it: its own pass
    // Two snapshots into fresh files, then two into recycled ones.
    for (int i = 0; i < 4; ++i) {
      t.start_snapshot();
      t.train_step();
      t.poll_snapshot();
    }
    // Rank 1 flips a bit while the snapshot of this state is being read.
    if (comm.rank() == 1) t.flip_bit_before_forward(t.step());
    t.start_snapshot();
    t.train_step();
    t.poll_snapshot();
    testing::require(t.snapshots_enabled(), "rank {}'s snapshots stopped", comm.rank());
    testing::require(seen.size() == 6, "rank {} saw {} checks", comm.rank(), seen.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      testing::require(seen[i].mine == seen[i].own_pass,
                       "ZeRO {}, rank {}, check {}: hash {:016x} compared, {:016x} by a pass "
                       "of its own (fused: {})",
                       zero, comm.rank(), i, seen[i].mine, seen[i].own_pass, seen[i].fused);
      const bool want_fused = i >= 1 && (i < 5 || comm.rank() == 0);
      testing::require(seen[i].fused == want_fused, "ZeRO {}, rank {}, check {}: fused {}", zero,
                       comm.rank(), i, seen[i].fused);
      testing::require(seen[i].clean == (i < 5), "ZeRO {}, rank {}, check {}: clean {}", zero,
                       comm.rank(), i, seen[i].clean);
    }
  });
}

TEST(SnapshotHash, UnderZero0TheCheckTakesTheUpdatesHashOfParametersAndMoments) {
  check_zero(0);
}

TEST(SnapshotHash, UnderZero1TheCheckTakesTheCopysHashOfTheParameters) {
  check_zero(1);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

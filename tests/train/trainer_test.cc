// The trainer end to end: exact resume, accumulation, seed checks.
#include "brigade/train/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/model/param_layout.h"
#include "testing/saved_states.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  // A small model on the bundled Shakespeare text, prepared once per test.
  Config small_config(int64_t steps) const {
    Config c = Config::from_string(R"(
      [model]
      n_layer = 2
      n_head = 2
      n_embd = 32
      block_size = 32
      vocab_size = 256
      [data]
      tokenizer = "byte"
      [train]
      micro_batch = 4
      grad_accum = 2
      seed = 7
      threads = 2
      [optim]
      lr = 3e-3
      warmup_steps = 3
      weight_decay = 0.1
      grad_clip = 1.0
    )");
    c.set("data.source=\"" BRIGADE_SOURCE_DIR "/data/tinyshakespeare.txt\"");
    c.set("data.dir=\"" + (dir_ / "data").string() + "\"");
    c.set("train.run_dir=\"" + (dir_ / "run").string() + "\"");
    c.set("train.steps=" + std::to_string(steps));
    return c;
  }

  // Trains one step with `opts` and returns the checkpoint it saved.
  static fs::path checkpoint_after_one_step(const GptConfig& model, const TrainOptions& opts) {
    Trainer t(model, opts);
    t.train_step();
    return t.save_checkpoint();
  }

  // Building a trainer from `opts` fails with an Error whose message holds
  // every one of `needles` (the problem and its fix).
  static void expect_refused(const GptConfig& model, const TrainOptions& opts,
                             const std::vector<std::string>& needles) {
    try {
      Trainer t(model, opts);
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      for (const std::string& needle : needles) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "'" << needle << "' not in: " << e.what();
      }
    }
  }

  testing::TempDir temp_{"brigade_trainer_test"};
  const fs::path& dir_ = temp_.path();
};

TEST_F(TrainerTest, ResumeIsBitIdenticalToAnUninterruptedRun) {
  Config c20 = small_config(20);
  const GptConfig model = GptConfig::from_config(c20);
  TrainOptions opts = TrainOptions::from_config(c20);

  Trainer straight(model, opts);
  for (int i = 0; i < 20; ++i) straight.train_step();

  opts.run_dir = (dir_ / "interrupted").string();
  fs::path saved;
  {
    Trainer first(model, opts);
    for (int i = 0; i < 10; ++i) first.train_step();
    saved = first.save_checkpoint();
  }
  opts.resume = saved.string();
  Trainer second(model, opts);
  EXPECT_EQ(second.step(), 10);
  for (int i = 0; i < 10; ++i) second.train_step();

  ASSERT_EQ(straight.params().size(), second.params().size());
  EXPECT_EQ(std::memcmp(straight.params().data(), second.params().data(),
                        static_cast<size_t>(straight.params().bytes())),
            0)
      << "parameters after 10 + resume + 10 steps differ from 20 straight steps";
}

TEST_F(TrainerTest, GradientAccumulationMatchesOneBigMicroBatch) {
  // grad_accum 2 x micro_batch 4 and grad_accum 1 x micro_batch 8 see the same
  // 8 samples of the global batch, so the losses agree to rounding.
  Config a = small_config(3), b = small_config(3);
  b.set("train.micro_batch=8");
  b.set("train.grad_accum=1");
  const GptConfig model = GptConfig::from_config(a);
  TrainOptions oa = TrainOptions::from_config(a), ob = TrainOptions::from_config(b);
  ob.data = oa.data;
  Trainer ta(model, oa), tb(model, ob);
  for (int i = 0; i < 3; ++i) {
    const double la = ta.train_step().loss, lb = tb.train_step().loss;
    EXPECT_NEAR(la, lb, 1e-5 * std::fabs(la)) << "step " << i;
  }
}

TEST_F(TrainerTest, ResumeRefusesAnotherSeed) {
  Config c = small_config(2);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  opts.resume = checkpoint_after_one_step(model, opts).string();
  opts.seed = 8;
  expect_refused(model, opts, {"train.seed = 7 but the config says 8", "set train.seed = 7"});
}

TEST_F(TrainerTest, ResumeRefusesAnotherGlobalBatch) {
  Config c = small_config(2);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  opts.resume = checkpoint_after_one_step(model, opts).string();
  opts.grad_accum = 3;  // global batch 12 instead of 8
  expect_refused(model, opts,
                 {"global batch of 8 sequences", "train.micro_batch * train.grad_accum = 12",
                  "whose product is 8"});
  opts.grad_accum = 1;  // micro_batch 8 x 1 is the same global batch: fine
  opts.micro_batch = 8;
  Trainer resumed(model, opts);
  EXPECT_EQ(resumed.step(), 1);
}

TEST_F(TrainerTest, ReusedDatasetWithAnotherTokenizerIsRefused) {
  Config c = small_config(1);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  { Trainer t(model, opts); }  // prepares data.dir with the byte tokenizer
  opts.data.tokenizer = (dir_ / "some_bpe").string();
  expect_refused(model, opts, {"was prepared with tokenizer", "delete"});
}

// A snapshot reads the live parameters and moments while the next step's
// forward and backward run (no staging copy); the step's update must wait
// for it. With two tokens a step and 6M parameters the copy takes longer
// than the forward and backward, so a missing wait shows as a snapshot
// holding part of the next step's update.
TEST_F(TrainerTest, ASnapshotHoldsItsStepWhileTheNextStepRuns) {
  Config c = small_config(3);
  c.set("model.n_embd=512");
  c.set("model.n_layer=2");
  c.set("model.block_size=2");
  c.set("train.micro_batch=1");
  c.set("train.grad_accum=1");
  c.set("train.threads=1");
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  opts.snapshot_dir = (dir_ / "snapshots").string();
  opts.snapshot_every = 1;
  fs::create_directories(opts.snapshot_dir);
  Trainer t(model, opts);
  ASSERT_TRUE(t.snapshots_enabled());
  t.train_step();
  // Steps 1 and 3 write fresh files (the slower copy); step 5 recycles
  // step 1's, through the mapping.
  for (int64_t step = 1; step <= 5; step += 2) {
    const fs::path checkpoint = t.save_checkpoint();  // staged: the step as it is
    t.start_snapshot();
    t.train_step();
    const fs::path snapshot = fs::path(opts.snapshot_dir) / fmt::format("step_{:08d}", step);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (t.snapshots_enabled() && !fs::exists(snapshot / "manifest.json") &&
           std::chrono::steady_clock::now() < deadline) {
      t.poll_snapshot();
    }
    ASSERT_TRUE(fs::exists(snapshot / "manifest.json")) << snapshot;
    verify_checkpoint(checkpoint);  // with its checksums
    const auto differs = testing::first_differing_state(model, checkpoint, snapshot);
    ASSERT_FALSE(differs) << "step " << step << ", state kind " << static_cast<int>(*differs);
    t.train_step();
  }
  EXPECT_TRUE(fs::exists(fs::path(opts.snapshot_dir) / "spare")) << "nothing was recycled";
}

// Once a spare shard is there, the update of a step whose snapshot follows
// writes that snapshot as it computes the state (Trainer::claim_snapshot):
// the snapshot must hold the step's parameters and both moments bit for
// bit, as a staged checkpoint of the same step does.
TEST_F(TrainerTest, AnUpdateWritesTheSnapshotOfItsStepOnceASpareIsThere) {
  Config c = small_config(3);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  opts.snapshot_dir = (dir_ / "snapshots").string();
  opts.snapshot_every = 1;
  opts.steps = 50;
  fs::create_directories(opts.snapshot_dir);
  auto trainer = std::make_unique<Trainer>(model, opts);
  Trainer& t = *trainer;
  ASSERT_TRUE(t.snapshots_enabled());
  int written_by_update = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    t.train_step();
    // A write of the state after the update (an injected flip) makes the
    // snapshot a copy of the state as it is when its save starts.
    const bool flipped = step == 5;
    if (flipped) t.flip_parameter_bit();
    const fs::path checkpoint = t.save_checkpoint();
    t.start_snapshot();
    // Settled (committed and pruned: the next update finds the spare).
    std::optional<AsyncCheckpointWriter::Stats> stats;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (t.snapshots_enabled() && !stats && std::chrono::steady_clock::now() < deadline) {
      stats = t.poll_snapshot();
    }
    ASSERT_TRUE(stats.has_value()) << "the snapshot of step " << step << " never settled";
    if (flipped) {
      EXPECT_FALSE(stats->prewritten) << "the update's values, not the flipped state";
    }
    written_by_update += stats->prewritten ? 1 : 0;
    const fs::path snapshot = fs::path(opts.snapshot_dir) / fmt::format("step_{:08d}", step);
    verify_checkpoint(checkpoint);  // with its checksums
    const auto differs = testing::first_differing_state(model, checkpoint, snapshot);
    ASSERT_FALSE(differs) << "step " << step << ", state kind " << static_cast<int>(*differs)
                          << (stats->prewritten ? ", written by the update" : ", copied");
  }
  // One snapshot kept (no replicas to check) and one being written: the
  // first spare is there once the second committed (steps 3, 4 and 6).
  EXPECT_GE(written_by_update, 3) << "the updates wrote too few snapshots";
  // A claim whose snapshot never starts (a stop agreed after the update,
  // the end of the run) leaves no shard behind once the trainer is gone.
  t.train_step();
  const fs::path claimed = partial_shard_path(opts.snapshot_dir, 7, 0);
  EXPECT_TRUE(fs::exists(claimed)) << "the update of step 7 claimed no spare";
  trainer.reset();
  EXPECT_FALSE(fs::exists(claimed)) << "a claimed shard outlived its trainer";
}

// In-memory snapshots on a tmpfs the test mounts (root; CI runs as root):
// one that has no room for two is refused at start, and one that fills up
// stops the snapshots, not the training.
class SnapshotTmpfs : public TrainerTest {
 protected:
  bool mount_tmpfs(int64_t bytes) {
    where_ = dir_ / "shm";
    fs::create_directories(where_);
    const std::string options = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", where_.c_str(), "tmpfs", 0, options.c_str()) == 0;
    return mounted_;
  }
  void TearDown() override {
    if (mounted_) ::umount2(where_.c_str(), MNT_DETACH);
  }
  // What two snapshots of the model take: parameters and both moments.
  static int64_t state_bytes(const GptConfig& model) {
    return 3 * static_cast<int64_t>(sizeof(float)) * ParamLayout(model).size();
  }
  fs::path where_;
  bool mounted_ = false;
};

TEST_F(SnapshotTmpfs, NoRoomForTwoSnapshotsMeansNoneAndTrainingGoesOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  Config c = small_config(2);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  ASSERT_TRUE(mount_tmpfs(state_bytes(model) * 3 / 2)) << std::strerror(errno);
  opts.snapshot_dir = where_.string();
  opts.snapshot_every = 1;
  Trainer t(model, opts);
  EXPECT_FALSE(t.snapshots_enabled());
  t.train_step();
  EXPECT_EQ(t.step(), 1);
}

TEST_F(SnapshotTmpfs, ASnapshotThatNoLongerFitsStopsSnapshotsNotTraining) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  Config c = small_config(4);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  ASSERT_TRUE(mount_tmpfs(state_bytes(model) * 5 / 2)) << std::strerror(errno);
  opts.snapshot_dir = where_.string();
  opts.snapshot_every = 1;
  Trainer t(model, opts);
  ASSERT_TRUE(t.snapshots_enabled());
  t.train_step();
  t.start_snapshot();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (t.snapshots_enabled() && !fs::exists(where_ / "step_00000001" / "manifest.json") &&
         std::chrono::steady_clock::now() < deadline) {
    t.poll_snapshot();
  }
  ASSERT_TRUE(fs::exists(where_ / "step_00000001" / "manifest.json"));
  // Something else takes the tmpfs: the next snapshot cannot be written.
  {
    std::ofstream ballast(where_ / "ballast", std::ios::binary);
    const std::vector<char> block(1 << 16, 'x');
    while (ballast.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
  t.train_step();
  EXPECT_NO_THROW({
    t.start_snapshot();
    while (t.snapshots_enabled()) t.poll_snapshot();
  });
  EXPECT_FALSE(t.snapshots_enabled());
  t.train_step();
  EXPECT_EQ(t.step(), 3);
  // The failed step left nothing behind; the last good snapshot stays.
  EXPECT_FALSE(fs::exists(where_ / "step_00000002.partial"));
  EXPECT_TRUE(fs::exists(where_ / "step_00000001" / "manifest.json"));
}

// A restarted generation finds its area holding the last one's snapshot
// and spare, which these snapshots replace: room, not a reason to go
// without snapshots just when a restart shows they are needed.
TEST_F(SnapshotTmpfs, AnEarlierGenerationsSnapshotsCountAsRoom) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  Config c = small_config(4);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  ASSERT_TRUE(mount_tmpfs(state_bytes(model) * 5 / 2 + (64 << 10))) << std::strerror(errno);
  opts.snapshot_dir = where_.string();
  opts.snapshot_every = 1;
  {
    Trainer first(model, opts);
    ASSERT_TRUE(first.snapshots_enabled());
    for (int step = 1; step <= 3; ++step) {
      first.train_step();
      first.start_snapshot();
    }
    first.train_step();
    while (first.snapshots_enabled() && !fs::exists(where_ / "step_00000003" / "manifest.json")) {
      first.poll_snapshot();
    }
    ASSERT_TRUE(fs::exists(where_ / "spare"));
  }
  Trainer second(model, opts);
  EXPECT_TRUE(second.snapshots_enabled());
}

// Across nodes the agent keeps another node's part in the same area
// (replicas/): it stays, so it is no room for this node's snapshots.
TEST_F(SnapshotTmpfs, AReplicaKeptInTheAreaIsNoRoom) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  Config c = small_config(4);
  const GptConfig model = GptConfig::from_config(c);
  TrainOptions opts = TrainOptions::from_config(c);
  ASSERT_TRUE(mount_tmpfs(state_bytes(model) * 5 / 2 + (64 << 10))) << std::strerror(errno);
  fs::create_directories(where_ / "replicas" / "node-1");
  {
    std::ofstream replica(where_ / "replicas" / "node-1" / "shard", std::ios::binary);
    const std::vector<char> bytes(static_cast<size_t>(state_bytes(model)), 'x');
    replica.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(replica.good());
  }
  opts.snapshot_dir = where_.string();
  opts.snapshot_every = 1;
  Trainer t(model, opts);
  EXPECT_FALSE(t.snapshots_enabled()) << "the replica counted as room";
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

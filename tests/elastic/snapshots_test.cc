// Where a restarted worker resumes from (the newer of the newest disk
// checkpoint and the newest in-memory snapshot), and the snapshot area's
// life: private, and gone with the agent. A whole restart from a snapshot
// runs in tests/cli/elastic_test.cc.
#include "brigade/elastic/snapshots.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"
#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

// A real, verifying checkpoint of a tiny model at `step` under root.
void complete_step(const fs::path& root, int64_t step) {
  GptConfig config;
  config.n_layer = 1;
  config.n_head = 1;
  config.n_embd = 8;
  config.block_size = 4;
  config.vocab_size = 16;
  const std::vector<float> zeros(static_cast<size_t>(ParamLayout(config).size()), 0.0f);
  save_checkpoint(root, step, config, zeros.data(), zeros.data(), zeros.data(),
                  CheckpointHeader{{{"dp", 1}}, {{"step", step}}, ""});
}

TEST(Snapshots, TheNewerOfCheckpointAndSnapshotWinsAndATieGoesToTheCheckpoint) {
  testing::TempDir dir("brigade_snapshots");
  const fs::path run = dir.path() / "run", snaps = dir.path() / "snaps";
  fs::create_directories(snaps);
  EXPECT_FALSE(newest_resume_point(run, snaps));

  complete_step(run / "checkpoints", 5);
  auto point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_EQ(point->step, 5);
  EXPECT_FALSE(point->from_snapshot);

  complete_step(snaps, 7);
  fs::create_directories(snaps / "step_00000008.partial");  // a write in progress is not a snapshot
  point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_EQ(point->step, 7);
  EXPECT_TRUE(point->from_snapshot);
  EXPECT_EQ(point->dir, snaps / "step_00000007");

  // A snapshot that does not verify is passed over for the checkpoint.
  complete_step(snaps, 9);
  for (const auto& entry : fs::directory_iterator(snaps / "step_00000009")) {
    if (entry.path().extension() != ".safetensors") continue;
    std::fstream shard(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(-1, std::ios::end);
    shard.put('\x7f');
  }
  point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_EQ(point->step, 5);
  EXPECT_FALSE(point->from_snapshot);
  fs::remove_all(snaps / "step_00000009");

  complete_step(run / "checkpoints", 7);
  point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_FALSE(point->from_snapshot);  // durable beats volatile at the same step

  point = newest_resume_point(run, "");
  ASSERT_TRUE(point);
  EXPECT_FALSE(point->from_snapshot);
}

TEST(Snapshots, TheAreaIsPrivateAndRemovedWithEverythingInIt) {
  testing::TempDir dir("brigade_snapshots");
  fs::path where;
  {
    std::optional<SnapshotArea> area = SnapshotArea::create(dir.path());
    ASSERT_TRUE(area);
    where = area->path();
    EXPECT_EQ(where.parent_path(), dir.path());
    struct stat st {};
    ASSERT_EQ(::stat(where.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    complete_step(where, 3);
    const std::optional<SnapshotArea> moved = std::move(area);
    EXPECT_TRUE(fs::exists(where / "step_00000003" / "manifest.json"));
  }
  EXPECT_FALSE(fs::exists(where));
  // No place to put them: none, and the job goes on with disk checkpoints.
  EXPECT_FALSE(SnapshotArea::create(dir.path() / "missing"));
}

TEST(Snapshots, AreasOfAgentsThatDiedAreRemovedOthersStay) {
  testing::TempDir dir("brigade_snapshots");
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  // An agent killed with SIGKILL: its area is left, unlocked, and old.
  const fs::path dead = dir.path() / "brigade-snapshots-dead01";
  fs::create_directories(dead / "step_00000004");
  fs::last_write_time(dead, old);
  // A live agent's area: locked, however old.
  std::optional<SnapshotArea> live = SnapshotArea::create(dir.path());
  ASSERT_TRUE(live);
  fs::last_write_time(live->path(), old);
  // One just created, not locked yet: too new to judge.
  const fs::path fresh = dir.path() / "brigade-snapshots-fresh1";
  fs::create_directories(fresh);
  // Not ours by name.
  const fs::path other = dir.path() / "something-else";
  fs::create_directories(other);
  fs::last_write_time(other, old);

  const std::optional<SnapshotArea> next = SnapshotArea::create(dir.path());
  ASSERT_TRUE(next);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live->path()));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(other));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

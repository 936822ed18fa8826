// Where a restarted worker resumes from (the newer of the newest disk
// checkpoint and the newest in-memory snapshot), and the snapshot area's
// life: private, and gone with the agent. A whole restart from a snapshot
// runs in tests/cli/elastic_test.cc.
#include "brigade/elastic/snapshots.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace {
namespace fs = std::filesystem;

// A complete step directory, as far as choosing one goes: it has a manifest.
void complete_step(const fs::path& root, const char* name) {
  fs::create_directories(root / name);
  std::ofstream(root / name / "manifest.json") << "{}";
}

TEST(Snapshots, TheNewerOfCheckpointAndSnapshotWinsAndATieGoesToTheCheckpoint) {
  testing::TempDir dir("brigade_snapshots");
  const fs::path run = dir.path() / "run", snaps = dir.path() / "snaps";
  fs::create_directories(snaps);
  EXPECT_FALSE(newest_resume_point(run, snaps));

  complete_step(run / "checkpoints", "step_00000005");
  auto point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_EQ(point->step, 5);
  EXPECT_FALSE(point->from_snapshot);

  complete_step(snaps, "step_00000007");
  fs::create_directories(snaps / "step_00000008.partial");  // a write in progress is not a snapshot
  point = newest_resume_point(run, snaps);
  ASSERT_TRUE(point);
  EXPECT_EQ(point->step, 7);
  EXPECT_TRUE(point->from_snapshot);
  EXPECT_EQ(point->dir, snaps / "step_00000007");

  complete_step(run / "checkpoints", "step_00000007");
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
    complete_step(where, "step_00000003");
    const std::optional<SnapshotArea> moved = std::move(area);
    EXPECT_TRUE(fs::exists(where / "step_00000003" / "manifest.json"));
  }
  EXPECT_FALSE(fs::exists(where));
  // No place to put them: none, and the job goes on with disk checkpoints.
  EXPECT_FALSE(SnapshotArea::create(dir.path() / "missing"));
}

}  // namespace
}  // namespace brigade::elastic

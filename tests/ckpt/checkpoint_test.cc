// Distributed checkpoints: boxes of flat ranges, the manifest's checks, a
// save by several "ranks" (each its slices, as ZeRO cuts them) loaded whole,
// and corruption: a changed, truncated or missing shard is found and named,
// and resume falls back to the previous checkpoint.
#include "brigade/ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/parallel/grad_buckets.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

// Every flat range of a tensor, cut into boxes and scattered back, lands on
// exactly its elements.
TEST(TensorBox, FlatRangesBecomeBoxesInStorageOrder) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 5}, {2, 3, 4}};
  for (const auto& shape : shapes) {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    for (int64_t begin = 0; begin <= n; ++begin) {
      for (int64_t end = begin; end <= n; ++end) {
        const auto boxes = flat_range_boxes(shape, begin, end);
        EXPECT_LE(boxes.size(), 2 * shape.size() - 1);
        std::vector<float> data(static_cast<size_t>(end - begin));
        std::iota(data.begin(), data.end(), static_cast<float>(begin));
        std::vector<float> tensor(static_cast<size_t>(n), -1.0f);
        const float* next = data.data();
        int64_t total = 0;
        for (const TensorBox& box : boxes) {
          ASSERT_TRUE(box_inside(box, shape));
          scatter_box(next, box, shape, tensor.data());
          next += box.numel();
          total += box.numel();
        }
        ASSERT_EQ(total, end - begin);
        for (int64_t i = 0; i < n; ++i) {
          const float expected = i >= begin && i < end ? static_cast<float>(i) : -1.0f;
          ASSERT_EQ(tensor[i], expected) << "range [" << begin << ", " << end << ") element " << i;
        }
      }
    }
  }
}

nlohmann::json valid_manifest() {
  return nlohmann::json::parse(R"({
    "format": "brigade-checkpoint-1", "step": 3, "model": {}, "mesh": {}, "trainer_state": {},
    "tokenizer": "byte",
    "tensors": [{"name": "model/w", "dtype": "F32", "shape": [2, 3], "chunks": [
      {"file": "a.safetensors", "key": "k0", "offset": 0, "offsets": [0, 0], "sizes": [1, 3]},
      {"file": "b.safetensors", "key": "k1", "offset": 5, "offsets": [1, 0], "sizes": [1, 3]}]}],
    "shards": [{"file": "a.safetensors", "bytes": 10, "xxh64": "0123456789abcdef"},
               {"file": "b.safetensors", "bytes": 10, "xxh64": "0123456789abcdef"}]
  })");
}

TEST(Manifest, RejectsWhatALoaderCouldNotTrust) {
  EXPECT_NO_THROW(Manifest::from_json(valid_manifest(), "m"));
  const auto rejects = [](const std::function<void(nlohmann::json&)>& edit, const char* why) {
    nlohmann::json j = valid_manifest();
    edit(j);
    try {
      Manifest::from_json(j, "m");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("m"), std::string::npos) << e.what();
    }
  };
  rejects([](auto& j) { j["format"] = "other"; }, "unknown format");
  rejects([](auto& j) { j.erase("shards"); }, "no shards");
  rejects([](auto& j) { j["tensors"][0]["chunks"][1]["offsets"] = {1, 1}; }, "outside the shape");
  rejects([](auto& j) { j["tensors"][0]["chunks"][1]["offsets"] = {0, 0}; }, "overlap");
  rejects([](auto& j) { j["tensors"][0]["chunks"].erase(1); }, "incomplete coverage");
  rejects([](auto& j) { j["tensors"][0]["chunks"][0]["file"] = "c.safetensors"; }, "unlisted");
  rejects([](auto& j) { j["shards"][0]["xxh64"] = "xyz"; }, "bad hash");
  rejects([](auto& j) { j["shards"][0]["file"] = "../a.safetensors"; }, "path escape");
  rejects([](auto& j) { j["tensors"][0]["shape"] = {-2, 3}; }, "negative shape");
  rejects([](auto& j) { j["tensors"][0]["dtype"] = "Q4"; }, "unknown dtype");
  rejects([](auto& j) { j["tensors"][0]["chunks"][0]["offset"] = -1; }, "negative offset");
  rejects([](auto& j) { j["tensors"].push_back(j["tensors"][0]); }, "duplicate tensor");
}

class CheckpointTest : public ::testing::Test {
 protected:
  GptConfig config() const {
    Config c = Config::from_string(
        "[model]\nn_layer = 2\nn_head = 2\nn_embd = 24\nblock_size = 16\nvocab_size = 67\n");
    return GptConfig::from_config(c);
  }
  // Distinct values per kind and element, so a misplaced chunk shows.
  std::vector<float> state(int kind) const {
    std::vector<float> v(static_cast<size_t>(ParamLayout(config()).size()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(kind * 100000 + i);
    return v;
  }
  // Saves step `step` as `ranks` ranks, each writing its ZeRO slices.
  fs::path save_as_ranks(int ranks, int64_t step) {
    const int64_t size = ParamLayout(config()).size();
    const BucketPlan plan(size, ranks, 1000);
    const auto params = state(0), m = state(1), v = state(2);
    begin_checkpoint(root(), step);
    for (int r = 0; r < ranks; ++r) {
      std::vector<CheckpointPiece> pieces;
      for (const FlatRange& s : plan.owned(r)) {
        const int64_t end = std::min(s.end, size);
        if (s.begin >= end) continue;
        pieces.push_back({StateKind::kParams, s.begin, end, params.data() + s.begin});
        pieces.push_back({StateKind::kExpAvg, s.begin, end, m.data() + s.begin});
        pieces.push_back({StateKind::kExpAvgSq, s.begin, end, v.data() + s.begin});
      }
      write_checkpoint_shard(root(), step, r, config(), pieces);
    }
    return commit_checkpoint(root(), step, ranks, config(),
                             {{{"dp", ranks}}, {{"step", step}}, "byte"});
  }
  fs::path root() const { return temp_.path() / "checkpoints"; }
  int step_dirs_count() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(root())) {
      n += e.path().filename().string().starts_with("step_") ? 1 : 0;
    }
    return n;
  }
  // Elements of the layout that belong to a tensor (padding is not saved).
  std::vector<bool> in_tensor() const {
    const ParamLayout layout(config());
    std::vector<bool> mask(static_cast<size_t>(layout.size()), false);
    for (const ParamInfo& p : layout.params()) {
      std::fill(mask.begin() + p.offset, mask.begin() + p.offset + p.numel, true);
    }
    return mask;
  }

  testing::TempDir temp_{"brigade_checkpoint_test"};
};

TEST_F(CheckpointTest, ShardsOfAnyRankCountLoadWhole) {
  for (int ranks : {1, 3, 4}) {
    const fs::path dir = save_as_ranks(ranks, 10 + ranks);
    EXPECT_TRUE(fs::exists(dir / "manifest.json"));
    EXPECT_FALSE(fs::exists(dir.string() + ".partial"));
    const Manifest manifest = verify_checkpoint(dir);
    EXPECT_EQ(manifest.shards.size(), static_cast<size_t>(ranks));
    EXPECT_EQ(manifest.tokenizer, "byte");
    const auto mask = in_tensor();
    for (int kind = 0; kind < 3; ++kind) {
      const auto expected = state(kind);
      std::vector<float> loaded(expected.size(), -1.0f);
      load_checkpoint_state(dir, manifest, config(), static_cast<StateKind>(kind), loaded.data());
      for (size_t i = 0; i < loaded.size(); ++i) {
        ASSERT_EQ(loaded[i], mask[i] ? expected[i] : -1.0f)
            << ranks << " ranks, kind " << kind << ", element " << i;
      }
    }
  }
}

// An in-memory snapshot's saves (ShardWriting): pruning keeps the removed
// step's shards as spares, the next save overwrites them in place, the
// shards carry no checksum, and a copy to disk gains them.
TEST_F(CheckpointTest, SnapshotsRecycleTheirShardsAndACopyToDiskGainsChecksums) {
  const int64_t size = ParamLayout(config()).size();
  auto params = state(0);
  const auto m = state(1), v = state(2);
  const ShardWriting snapshot{.recycle = true, .checksum = false, .read = {}};
  auto save = [&](int64_t step) {
    begin_checkpoint(root(), step);
    write_checkpoint_shard(root(), step, 0, ParamLayout(config()),
                           {{StateKind::kParams, 0, size, params.data()},
                            {StateKind::kExpAvg, 0, size, m.data()},
                            {StateKind::kExpAvgSq, 0, size, v.data()}},
                           snapshot);
    commit_checkpoint(root(), step, 1, config(), {{{"dp", 1}}, {{"step", step}}, "byte"});
    prune_checkpoints(root(), 1, /*recycle=*/true);
  };
  auto inode = [](const fs::path& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  };
  const fs::path spare = root() / "spare" / "shard_00000.safetensors";
  save(1);
  const ino_t first = inode(root() / "step_00000001" / "shard_00000.safetensors");
  save(2);
  EXPECT_EQ(inode(spare), first) << "step 1's shard waits as the spare";
  params[0] = -7;
  save(3);
  const fs::path newest = root() / "step_00000003";
  EXPECT_EQ(inode(newest / "shard_00000.safetensors"), first) << "the spare was not reused";
  EXPECT_EQ(latest_checkpoint(root()), newest);
  EXPECT_EQ(step_dirs_count(), 1);

  // Outside the agent's area a snapshot is no checkpoint: nothing vouches for it.
  try {
    verify_checkpoint(newest);
    ADD_FAILURE() << "a snapshot verified as a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in-memory snapshot"), std::string::npos) << e.what();
  }
  Manifest manifest = verify_checkpoint(newest, /*snapshot=*/true);
  ASSERT_EQ(manifest.shards.size(), 1u);
  EXPECT_FALSE(manifest.shards[0].xxh64.has_value());
  std::vector<float> loaded(static_cast<size_t>(size));
  load_checkpoint_state(newest, manifest, config(), StateKind::kParams, loaded.data());
  EXPECT_EQ(loaded[0], -7);
  // Sizes are still checked.
  fs::resize_file(newest / "shard_00000.safetensors", 100);
  EXPECT_THROW(verify_checkpoint(newest, /*snapshot=*/true), Error);
  save(4);
  EXPECT_TRUE(fs::exists(spare));
  release_spares(root());
  EXPECT_FALSE(fs::exists(spare)) << "stopped snapshots keep no spare in memory";

  const fs::path disk = temp_.path() / "disk";
  const fs::path kept = copy_checkpoint(root() / "step_00000004", disk);
  EXPECT_EQ(kept, disk / "step_00000004");
  manifest = verify_checkpoint(kept);
  ASSERT_TRUE(manifest.shards[0].xxh64.has_value()) << "a checkpoint on disk has checksums";
  EXPECT_EQ(*manifest.shards[0].xxh64, file_xxh64(kept / "shard_00000.safetensors"));
  EXPECT_FALSE(fs::exists(disk / "step_00000004.partial"));
  // ... which now catch a flipped byte.
  {
    std::fstream f(kept / "shard_00000.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  EXPECT_THROW(verify_checkpoint(kept), Error);
}

TEST_F(CheckpointTest, AStepWithoutManifestDoesNotExist) {
  save_as_ranks(2, 5);
  // A save that died after its shards, before the manifest.
  begin_checkpoint(root(), 6);
  write_checkpoint_shard(root(), 6, 0, config(), {});
  EXPECT_EQ(latest_checkpoint(root())->filename(), "step_00000005");
  EXPECT_EQ(resolve_checkpoint(temp_.path()).dir.filename(), "step_00000005");
}

// What saves, replacements and prunes of an earlier process left half-way
// goes at the next process's first save; the checkpoints and anything that
// is not a save's stay.
TEST_F(CheckpointTest, ClearingLeftoversRemovesEveryKindAndKeepsTheCheckpoints) {
  save_as_ranks(2, 5);
  for (const char* left : {"step_00000006.partial", "step_00000004.old", "step_00000003.pruned"}) {
    fs::create_directories(root() / left);
    std::ofstream(root() / left / "shard_00000.safetensors") << "stale";
  }
  fs::create_directories(root() / "notes");
  clear_checkpoint_leftovers(root());
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(root())) kept.push_back(e.path().filename());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"notes", "step_00000005"}));
  EXPECT_NO_THROW(verify_checkpoint(root() / "step_00000005"));
}

TEST_F(CheckpointTest, ACorruptShardIsNamedAndResumeFallsBack) {
  save_as_ranks(2, 5);
  const fs::path newest = save_as_ranks(2, 6);
  const fs::path shard = newest / "shard_00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) - 3));
    f.put('\x7f');
  }
  try {
    verify_checkpoint(newest);
    ADD_FAILURE() << "a changed shard verified";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("shard_00001.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("xxHash64"), std::string::npos) << message;
    EXPECT_NE(message.find("model/"), std::string::npos) << "names the tensors: " << message;
  }
  EXPECT_EQ(resolve_checkpoint(temp_.path()).dir.filename(), "step_00000005");

  fs::resize_file(shard, fs::file_size(shard) / 2);  // truncated
  EXPECT_THROW(verify_checkpoint(newest), Error);
  fs::remove(newest / "shard_00000.safetensors");  // missing
  EXPECT_THROW(verify_checkpoint(newest), Error);
  write_file_atomic(newest / "manifest.json", "{\"format\": ");  // torn manifest
  EXPECT_THROW(verify_checkpoint(newest), Error);
  // A manifest changed in a way that still parses: the step number.
  const fs::path older = root() / "step_00000005";
  std::string text = read_file(older / "manifest.json");
  const size_t at = text.find("\"step\": 5");
  ASSERT_NE(at, std::string::npos);
  text[at + 8] = '4';
  write_file_atomic(older / "manifest.json", text);
  try {
    verify_checkpoint(older);
    ADD_FAILURE() << "an edited manifest verified";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("own xxHash64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_checkpoint(temp_.path()), Error);  // neither verifies now
}

TEST_F(CheckpointTest, CommitRefusesShardsThatDoNotCoverTheModel) {
  begin_checkpoint(root(), 7);
  const auto params = state(0);
  write_checkpoint_shard(root(), 7, 0, config(), {{StateKind::kParams, 0, 100, params.data()}});
  const CheckpointHeader header{{{"dp", 1}}, nlohmann::json::object(), "byte"};
  try {
    commit_checkpoint(root(), 7, 1, config(), header);
    ADD_FAILURE() << "committed a checkpoint missing most of the model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elements"), std::string::npos) << e.what();
  }
  try {
    commit_checkpoint(root(), 7, 2, config(), header);
    ADD_FAILURE() << "committed without rank 1's shard";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(latest_checkpoint(root()).has_value());
}

// Resuming from step 10 of a run that went on to 30: steps 20 and 30 belong
// to the abandoned branch. They move aside whole (verifying where they go),
// the run's newest checkpoint is 10 again, pruning cannot see them, and a
// second rollback to the same step keeps both abandoned branches.
TEST_F(CheckpointTest, RollbackSetsTheLaterStepsAsideNeverMixingBranches) {
  for (int64_t step : {10, 20, 30}) save_as_ranks(2, step);
  // Not one of ours (no step number): left where it is.
  fs::create_directories(root() / "step_foo");
  std::ofstream(root() / "step_foo" / "manifest.json") << "{}";
  const auto moved = set_aside_checkpoints_after(root(), 10);
  ASSERT_EQ(moved.size(), 2u);
  const fs::path branch = root() / "abandoned" / "after_step_00000010";
  EXPECT_EQ(moved[0], branch / "step_00000020");
  EXPECT_EQ(moved[1], branch / "step_00000030");
  for (const fs::path& dir : moved) EXPECT_NO_THROW(verify_checkpoint(dir)) << dir;
  EXPECT_FALSE(fs::exists(root() / "step_00000020"));
  EXPECT_TRUE(fs::exists(root() / "step_foo" / "manifest.json"));
  fs::remove_all(root() / "step_foo");
  EXPECT_EQ(latest_checkpoint(root())->filename(), "step_00000010");
  EXPECT_EQ(resolve_checkpoint(temp_.path()).dir.filename(), "step_00000010");
  EXPECT_TRUE(set_aside_checkpoints_after(root(), 10).empty()) << "nothing newer is left";

  // The new branch saves 20 and 30 again; pruning to one keeps its 30 and
  // leaves the abandoned branch alone.
  save_as_ranks(2, 20);
  save_as_ranks(2, 30);
  prune_checkpoints(root(), 1);
  EXPECT_EQ(latest_checkpoint(root())->filename(), "step_00000030");
  EXPECT_TRUE(fs::exists(branch / "step_00000030" / "manifest.json"));

  // A second rollback, to 10 again: nothing at or before 10 is left here
  // after the prune, so 30 moves, to a branch of its own.
  const auto again = set_aside_checkpoints_after(root(), 10);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0], root() / "abandoned" / "after_step_00000010.2" / "step_00000030");
  EXPECT_FALSE(latest_checkpoint(root()).has_value());
}

TEST_F(CheckpointTest, AbandonRemovesOnlyTheUnfinishedStep) {
  save_as_ranks(1, 4);
  begin_checkpoint(root(), 5);
  write_checkpoint_shard(root(), 5, 0, config(), {});
  abandon_checkpoint(root(), 5);
  EXPECT_FALSE(fs::exists(root() / "step_00000005.partial"));
  EXPECT_NO_THROW(verify_checkpoint(root() / "step_00000004"));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

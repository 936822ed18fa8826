// Snapshot parts (ckpt/node_part.h): each "node" commits the shards of its
// ranks as a part; the parts of one step, gathered, assemble into a
// checkpoint that loads exactly the state saved; parts that do not belong
// together, or leave a rank out, are refused naming the problem.
#include "brigade/ckpt/node_part.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/parallel/grad_buckets.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

class NodePartTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 4;  // two nodes of two
  GptConfig config() const {
    Config c = Config::from_string(
        "[model]\nn_layer = 2\nn_head = 2\nn_embd = 24\nblock_size = 16\nvocab_size = 67\n");
    return GptConfig::from_config(c);
  }
  std::vector<float> state(int kind, int64_t step) const {
    std::vector<float> v(static_cast<size_t>(ParamLayout(config()).size()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(kind * 100000 + i + step);
    return v;
  }
  fs::path area(int node) const { return temp_.path() / ("node" + std::to_string(node)); }
  // Node `node`'s ranks write their ZeRO slices of `step` into its area;
  // its committer commits the part.
  fs::path write_part(int node, int64_t step, int64_t keep = 2) {
    const int64_t size = ParamLayout(config()).size();
    const BucketPlan plan(size, kRanks, 1000);
    const auto params = state(0, step), m = state(1, step), v = state(2, step);
    begin_checkpoint(area(node), step);  // the committer's phase 1
    for (int r = node * 2; r < node * 2 + 2; ++r) {
      std::vector<CheckpointPiece> pieces;
      for (const FlatRange& s : plan.owned(r)) {
        const int64_t end = std::min(s.end, size);
        if (s.begin >= end) continue;
        pieces.push_back({StateKind::kParams, s.begin, end, params.data() + s.begin});
        pieces.push_back({StateKind::kExpAvg, s.begin, end, m.data() + s.begin});
        pieces.push_back({StateKind::kExpAvgSq, s.begin, end, v.data() + s.begin});
      }
      write_checkpoint_shard(area(node), step, r, ParamLayout(config()), pieces,
                             {.recycle = true, .checksum = false, .read = {}});
    }
    NodePart part;
    part.step = step;
    part.node = node;
    part.first_rank = node * 2;
    part.ranks = 2;
    part.num_shards = kRanks;
    part.config = config();
    if (node == 0) part.header = CheckpointHeader{{{"dp", kRanks}}, {{"step", step}}, "byte"};
    return commit_node_part(area(node), part, keep, /*recycle=*/true);
  }
  testing::TempDir temp_;
};

TEST_F(NodePartTest, PartsOfEveryNodeAssembleIntoTheSavedState) {
  const fs::path a = write_part(0, 5), b = write_part(1, 5);
  EXPECT_EQ(a, node_part_directory(area(0), 5));
  EXPECT_EQ(node_part_steps(area(0)), std::vector<int64_t>{5});
  // A part is no checkpoint: a resume never picks one.
  EXPECT_FALSE(latest_checkpoint(area(0)));
  const NodePart read = read_node_part(b);
  EXPECT_EQ(read.step, 5);
  EXPECT_EQ(read.node, 1);
  EXPECT_EQ(read.first_rank, 2);
  EXPECT_FALSE(read.header);

  const fs::path dir = assemble_checkpoint({b, a}, temp_.path() / "assembled");
  EXPECT_EQ(dir, step_directory(temp_.path() / "assembled", 5));
  const Manifest manifest = verify_checkpoint(dir, /*snapshot=*/true);
  EXPECT_EQ(manifest.shards.size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(manifest.trainer_state.at("step"), 5);
  const StateKind kinds[] = {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq};
  for (int k = 0; k < 3; ++k) {
    std::vector<float> loaded(state(k, 5).size(), -1.0f);
    load_checkpoint_state(dir, manifest, config(), kinds[k], loaded.data());
    const ParamLayout layout(config());
    const std::vector<float> expected = state(k, 5);
    for (const ParamInfo& p : layout.params()) {
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        ASSERT_EQ(loaded[i], expected[i]) << "kind " << k << " element " << i;
      }
    }
  }
  // The parts stay as they were: the next restart may need them again.
  EXPECT_NO_THROW(read_node_part(a));
}

TEST_F(NodePartTest, ANodeKeepsItsNewestPartsAndRecyclesTheRest) {
  write_part(1, 3);
  write_part(1, 4);
  write_part(1, 5);
  EXPECT_EQ(node_part_steps(area(1)), (std::vector<int64_t>{4, 5}));
  EXPECT_TRUE(fs::exists(area(1) / "spare" / "shard_00002.safetensors"));
}

TEST_F(NodePartTest, AnAssembledCheckpointSharesThePartsFilesRatherThanCopies) {
  // tmpfs: a copy would hold the state twice in memory.
  const fs::path a = write_part(0, 5), b = write_part(1, 5);
  const fs::path dir = assemble_checkpoint({a, b}, area(0));
  EXPECT_EQ(fs::hard_link_count(dir / "shard_00002.safetensors"), 2u);
  EXPECT_TRUE(fs::equivalent(dir / "shard_00000.safetensors", a / "shard_00000.safetensors"));
  // The parts go; the checkpoint stays whole.
  fs::remove_all(a);
  fs::remove_all(b);
  EXPECT_NO_THROW(verify_checkpoint(dir, /*snapshot=*/true));
}

TEST_F(NodePartTest, APinnedPartIsNeitherPrunedNorRecycledUntilUnpinned) {
  const fs::path sent = write_part(1, 3);
  pin_node_part(area(1), 3);
  const std::string shard = read_file(sent / "shard_00002.safetensors");
  // Its agent's send is slower than three steps.
  write_part(1, 4);
  write_part(1, 5);
  write_part(1, 6);
  EXPECT_EQ(node_part_steps(area(1)), (std::vector<int64_t>{3, 5, 6}));
  EXPECT_EQ(read_file(sent / "shard_00002.safetensors"), shard) << "recycled while pinned";
  // Another step's unpin leaves the pin; the send's own ends it.
  unpin_node_part(area(1), 5);
  EXPECT_EQ(pinned_node_part(area(1)), 3);
  unpin_node_part(area(1), 3);
  EXPECT_FALSE(pinned_node_part(area(1)));
  write_part(1, 7);
  EXPECT_EQ(node_part_steps(area(1)), (std::vector<int64_t>{6, 7}));
}

TEST_F(NodePartTest, ACommitWithoutEveryShardOfTheNodeIsRefused) {
  write_checkpoint_shard(area(1), 6, 2, config(), {});
  NodePart part;
  part.step = 6;
  part.node = 1;
  part.first_rank = 2;
  part.ranks = 2;
  part.num_shards = kRanks;
  part.config = config();
  try {
    commit_node_part(area(1), part, 2, false);
    FAIL() << "committed without rank 3's shard";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(node_part_steps(area(1)).empty());
}

TEST_F(NodePartTest, PartsThatDoNotMakeOneStepAreRefusedNamingWhy) {
  const fs::path a5 = write_part(0, 5), b5 = write_part(1, 5), b6 = write_part(1, 6);
  const fs::path out = temp_.path() / "assembled";
  const auto refused = [&](const std::vector<fs::path>& parts, const std::string& expected) {
    try {
      assemble_checkpoint(parts, out);
      ADD_FAILURE() << "assembled; expected: " << expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    // Nothing is left behind.
    EXPECT_FALSE(latest_checkpoint(out));
    EXPECT_FALSE(fs::exists(out / "step_00000005.partial"));
  };
  refused({a5, b6}, "do not belong together");
  refused({a5}, "no part holds rank 2's shard");
  refused({a5, b5, b5}, "both hold rank 2's shard");
  refused({b5}, "rank 0");
  // A malformed part.json is named.
  write_file_atomic(b5 / kNodePartFile, R"({"format": "brigade-node-part-1", "step": 5})");
  refused({a5, b5}, (b5 / kNodePartFile).string());
  // A part whose file says another step than its directory's.
  const fs::path b6_file = b6 / kNodePartFile;
  std::string text = read_file(b6_file);
  text.replace(text.find("\"step\": 6"), 9, "\"step\": 5");
  write_file_atomic(b6_file, text);
  refused({a5, b6}, "not its directory's");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

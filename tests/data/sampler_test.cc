#include "brigade/data/sampler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

using testing::TempDir;

// Shard k holds tokens k * 10000, k * 10000 + 1, ...: every token says which
// shard it is from and where, so a test can tell where a window came from.
std::vector<TokenShard> make_shards(const fs::path& dir, const std::vector<uint32_t>& sizes) {
  std::vector<TokenShard> shards;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint32_t> tokens(sizes[k]);
    for (uint32_t i = 0; i < sizes[k]; ++i) tokens[i] = static_cast<uint32_t>(k) * 10000 + i;
    const fs::path path = dir / ("shard_" + std::to_string(k) + ".bin");
    write_token_shard(path, tokens, 65536);
    shards.emplace_back(path);
  }
  return shards;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch fill(const GlobalSampler& sampler, uint64_t step, uint64_t first, int count) {
  Batch batch{std::vector<int32_t>(count * sampler.seq_len()),
              std::vector<int32_t>(count * sampler.seq_len())};
  sampler.fill(step, first, count, batch.inputs.data(), batch.targets.data());
  return batch;
}

TEST(GlobalSampler, WindowsAreContiguousShiftedAndInsideOneShard) {
  TempDir dir;
  const std::vector<uint32_t> sizes = {1000, 37, 0, 500};
  const std::vector<TokenShard> shards = make_shards(dir.path(), sizes);
  const int seq_len = 16;
  const GlobalSampler sampler(shards, 1234, seq_len);
  EXPECT_EQ(sampler.num_windows(), (1000u - 16) + (37u - 16) + (500u - 16));
  const int num_samples = 64;
  for (uint64_t step = 0; step < 20; ++step) {
    const Batch batch = fill(sampler, step, 0, num_samples);
    for (int i = 0; i < num_samples; ++i) {
      const int32_t* in = &batch.inputs[i * seq_len];
      const int32_t* tgt = &batch.targets[i * seq_len];
      const int32_t shard = in[0] / 10000;
      for (int t = 0; t < seq_len; ++t) {
        ASSERT_EQ(in[t], in[0] + t) << "step " << step << " sample " << i;
        ASSERT_EQ(tgt[t], in[t] + 1);
      }
      // The target of the last position is still in the same shard.
      ASSERT_LT(tgt[seq_len - 1] % 10000, static_cast<int32_t>(sizes[shard]));
    }
  }
}

TEST(GlobalSampler, EveryShardIsDrawnInProportionToItsWindows) {
  TempDir dir;
  const std::vector<TokenShard> shards = make_shards(dir.path(), {1000, 37});
  const GlobalSampler sampler(shards, 99, 16);
  int from_small = 0;
  const int num_steps = 200, num_samples = 50;
  for (uint64_t step = 0; step < num_steps; ++step) {
    const Batch batch = fill(sampler, step, 0, num_samples);
    for (int i = 0; i < num_samples; ++i) from_small += batch.inputs[i * 16] >= 10000;
  }
  // Expected 21 / 1005 of 10000 draws, about 209.
  EXPECT_GT(from_small, 120);
  EXPECT_LT(from_small, 300);
}

TEST(GlobalSampler, BatchDependsOnlyOnSeedAndStep) {
  TempDir dir;
  const std::vector<TokenShard> shards = make_shards(dir.path(), {5000});
  const GlobalSampler sampler(shards, 7, 32);
  const GlobalSampler same(shards, 7, 32);
  const GlobalSampler other_seed(shards, 8, 32);
  EXPECT_EQ(fill(sampler, 3, 0, 16), fill(same, 3, 0, 16));
  EXPECT_EQ(fill(sampler, 3, 0, 16), fill(sampler, 3, 0, 16));
  EXPECT_NE(fill(sampler, 3, 0, 16), fill(sampler, 4, 0, 16));
  EXPECT_NE(fill(sampler, 3, 0, 16), fill(other_seed, 3, 0, 16));
  // The contract: sample j of step s starts at window Philox::below(seed, s, j, windows).
  for (uint64_t j = 0; j < 16; ++j) {
    const Batch batch = fill(sampler, 3, j, 1);
    EXPECT_EQ(static_cast<uint64_t>(batch.inputs[0]),
              Philox::below(Philox::key(7, RngPurpose::kDataOrder), 3, j, 5000 - 32));
  }
}

TEST(GlobalSampler, AnySplitAcrossWorkersGivesTheSameGlobalBatch) {
  TempDir dir;
  const std::vector<TokenShard> shards = make_shards(dir.path(), {3000, 800});
  const int seq_len = 8, global_batch = 12;
  const GlobalSampler sampler(shards, 42, seq_len);
  for (uint64_t step : {0u, 1u, 17u, 100000u}) {
    const Batch whole = fill(sampler, step, 0, global_batch);
    for (int dp_size : {2, 3, 4, 6, 12}) {
      const int per_worker = global_batch / dp_size;
      for (int dp_rank = 0; dp_rank < dp_size; ++dp_rank) {
        // A separate sampler per worker, as each process would build.
        const GlobalSampler worker(shards, 42, seq_len);
        const Batch part = fill(worker, step, dp_rank * per_worker, per_worker);
        const size_t begin = static_cast<size_t>(dp_rank * per_worker * seq_len);
        const size_t size = static_cast<size_t>(per_worker * seq_len);
        EXPECT_TRUE(std::equal(part.inputs.begin(), part.inputs.end(), whole.inputs.begin() + begin,
                               whole.inputs.begin() + begin + size));
        EXPECT_TRUE(std::equal(part.targets.begin(), part.targets.end(),
                               whole.targets.begin() + begin,
                               whole.targets.begin() + begin + size));
      }
    }
  }
}

TEST(GlobalSampler, TooLittleDataIsAClearError) {
  TempDir dir;
  const std::vector<TokenShard> shards = make_shards(dir.path(), {10});
  try {
    GlobalSampler sampler(shards, 1, 10);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 10 tokens, fewer than block_size+1 = 11"),
              std::string::npos)
        << e.what();
  }
  // Exactly block_size + 1 tokens make one window.
  const GlobalSampler one_window(shards, 1, 9);
  EXPECT_EQ(one_window.num_windows(), 1u);
  const Batch batch = fill(one_window, 5, 0, 3);
  EXPECT_EQ(batch.targets.back(), 9);

  const std::vector<TokenShard> many = make_shards(dir.path(), {5, 6, 7});
  EXPECT_THROW(GlobalSampler(many, 1, 7), Error);
}

TEST(EvalWindows, AreSequentialAndNonOverlapping) {
  TempDir dir;
  const std::vector<TokenShard> shards = make_shards(dir.path(), {100, 16});
  const EvalWindows windows(shards[0], 16);
  EXPECT_EQ(windows.num_windows(), 6u);  // (100 - 1) / 16
  std::vector<int32_t> inputs(2 * 16), targets(2 * 16);
  windows.fill(4, 2, inputs.data(), targets.data());
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(inputs[t], 64 + t);
    EXPECT_EQ(targets[t], 65 + t);
  }
  EXPECT_EQ(EvalWindows(shards[1], 16).num_windows(), 0u);
  EXPECT_EQ(EvalWindows(shards[1], 15).num_windows(), 1u);
  EXPECT_THROW(windows.fill(5, 2, inputs.data(), targets.data()), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

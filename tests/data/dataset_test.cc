#include "brigade/data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/data/bpe_tokenizer.h"
#include "brigade/data/byte_tokenizer.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

using testing::TempDir;

std::string sample_text() {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text += "Line " + std::to_string(i) + ": the quick brown fox, caf\xc3\xa9 \xff.\n";
  }
  return text;
}

std::vector<uint32_t> read_all(const TokenShard& shard) {
  std::vector<int32_t> tokens(shard.size());
  shard.copy_window(0, shard.size(), tokens.data());
  return {tokens.begin(), tokens.end()};
}

TEST(PrepareDataset, ShardsConcatenateToTheInput) {
  TempDir dir;
  const std::string text = sample_text();
  write_file_atomic(dir.path() / "input.txt", text);
  const ByteTokenizer tokenizer;
  const DatasetManifest manifest =
      prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "ds", 0.1, false, 5000);
  const uint64_t num_val = (text.size() + 5) / 10;  // round(0.1 * n)
  EXPECT_EQ(manifest.val_shard.num_tokens, num_val);
  EXPECT_EQ(manifest.train_tokens(), text.size() - num_val);
  EXPECT_EQ(manifest.train_shards.size(), (text.size() - num_val + 4999) / 5000);
  EXPECT_EQ(manifest.train_shards[0].file, "train_000.bin");
  EXPECT_EQ(manifest.tokenizer_spec, "byte");

  const Dataset dataset(dir.path() / "ds");
  EXPECT_EQ(dataset.vocab_size(), 256u);
  EXPECT_EQ(dataset.tokenizer_spec(), "byte");
  EXPECT_EQ(dataset.train_shards().size(), manifest.train_shards.size());
  std::vector<uint32_t> all;
  for (const TokenShard& shard : dataset.train_shards()) {
    EXPECT_LE(shard.size(), 5000u);
    const std::vector<uint32_t> tokens = read_all(shard);
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  EXPECT_EQ(dataset.train_tokens(), all.size());
  const std::vector<uint32_t> val = read_all(dataset.val_shard());
  EXPECT_EQ(tokenizer.decode(val), text.substr(text.size() - num_val));  // the tail
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(tokenizer.decode(all), text);
}

TEST(PrepareDataset, WorksWithABpeTokenizer) {
  TempDir dir;
  const std::string text = sample_text();
  write_file_atomic(dir.path() / "input.txt", text);
  BpeTokenizer trained = BpeTokenizer::train(text, 300);
  trained.save(dir.path() / "tok");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer((dir.path() / "tok").string());
  prepare_dataset(dir.path() / "input.txt", *tokenizer, dir.path() / "ds", 0.2);

  const Dataset dataset(dir.path() / "ds");
  EXPECT_EQ(dataset.vocab_size(), 300u);
  EXPECT_EQ(dataset.tokenizer_spec(), tokenizer->spec());
  std::vector<uint32_t> all = read_all(dataset.train_shards().at(0));
  const std::vector<uint32_t> val = read_all(dataset.val_shard());
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(all, tokenizer->encode(text));
  EXPECT_EQ(load_tokenizer(dataset.tokenizer_spec())->decode(all), text);
}

TEST(PrepareDataset, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  write_file_atomic(dir.path() / "input.txt", sample_text());
  const ByteTokenizer tokenizer;
  prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "ds", 0.1, false, 4000);
  EXPECT_TRUE(fs::exists(dir.path() / "ds" / "train_002.bin"));
  try {
    prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "ds");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  // Overwriting with bigger shards leaves no stale train shard behind.
  const DatasetManifest manifest =
      prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "ds", 0.5, true);
  EXPECT_EQ(manifest.train_shards.size(), 1u);
  EXPECT_FALSE(fs::exists(dir.path() / "ds" / "train_001.bin"));
  EXPECT_EQ(Dataset(dir.path() / "ds").train_tokens(), manifest.train_tokens());
}

TEST(PrepareDataset, RejectsBadInputs) {
  TempDir dir;
  const ByteTokenizer tokenizer;
  write_file_atomic(dir.path() / "empty.txt", "");
  EXPECT_THROW(prepare_dataset(dir.path() / "empty.txt", tokenizer, dir.path() / "a"), Error);
  write_file_atomic(dir.path() / "input.txt", "some text");
  EXPECT_THROW(prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "b", 1.0), Error);
  EXPECT_THROW(prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "c", -0.1), Error);
  EXPECT_THROW(prepare_dataset(dir.path() / "nope.txt", tokenizer, dir.path() / "d"), Error);
  EXPECT_FALSE(fs::exists(dir.path() / "a" / "dataset.json"));
}

TEST(Dataset, ChecksShardsAgainstTheManifest) {
  TempDir dir;
  write_file_atomic(dir.path() / "input.txt", sample_text());
  const ByteTokenizer tokenizer;
  prepare_dataset(dir.path() / "input.txt", tokenizer, dir.path() / "ds", 0.1, false, 4000);
  write_token_shard(dir.path() / "ds" / "train_001.bin", std::vector<uint32_t>(10, 1), 256);
  try {
    Dataset dataset(dir.path() / "ds");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("train_001.bin"), std::string::npos) << message;
    EXPECT_NE(message.find("holds 10 tokens"), std::string::npos) << message;
  }
  fs::remove(dir.path() / "ds" / "val.bin");
  EXPECT_THROW(Dataset(dir.path() / "ds"), Error);
  try {
    Dataset dataset(dir.path() / "nothing-here");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing-here"), std::string::npos) << e.what();
  }
}

TEST(PrepareDataset, TinyShakespeareWithBytesIsFast) {
  const fs::path input = fs::path(BRIGADE_SOURCE_DIR) / "data" / "tinyshakespeare.txt";
  if (!fs::exists(input)) GTEST_SKIP() << input << " is not there";
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const DatasetManifest manifest = prepare_dataset(input, ByteTokenizer(), dir.path() / "ds");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(manifest.train_tokens() + manifest.val_shard.num_tokens, fs::file_size(input));
  EXPECT_LT(seconds, 2.0);  // typically ~0.05 s; generous for a loaded machine
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

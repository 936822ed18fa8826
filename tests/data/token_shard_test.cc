#include "brigade/data/token_shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

using testing::TempDir;

// The message of the Error that `open` throws, or "" if it throws none.
template <typename F>
std::string error_message(F&& open) {
  try {
    open();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TokenShard, RoundTripsUint16) {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 100000; ++i) tokens.push_back((i * 7919) % 65536);
  const fs::path path = dir.path() / "a.bin";
  write_token_shard(path, tokens, 65536);
  EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 2 * tokens.size());

  const TokenShard shard(path);
  EXPECT_EQ(shard.dtype(), TokenDtype::kUint16);
  EXPECT_EQ(shard.size(), tokens.size());
  EXPECT_EQ(shard.vocab_size(), 65536u);
  for (size_t i = 0; i < tokens.size(); i += 997) EXPECT_EQ(shard.token(i), tokens[i]);
  EXPECT_EQ(shard.token(tokens.size() - 1), tokens.back());
  std::vector<int32_t> window(50);
  shard.copy_window(12345, window.size(), window.data());
  for (size_t i = 0; i < window.size(); ++i) {
    EXPECT_EQ(window[i], static_cast<int32_t>(tokens[12345 + i]));
  }
}

TEST(TokenShard, RoundTripsUint32) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 70000, 99999, 1, 2};
  const fs::path path = dir.path() / "b.bin";
  write_token_shard(path, tokens, 100000);
  EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 4 * tokens.size());
  const TokenShard shard(path);
  EXPECT_EQ(shard.dtype(), TokenDtype::kUint32);
  ASSERT_EQ(shard.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard.token(i), tokens[i]);
  std::vector<int32_t> window(tokens.size());
  shard.copy_window(0, tokens.size(), window.data());
  EXPECT_EQ(std::vector<uint32_t>(window.begin(), window.end()), tokens);
}

TEST(TokenShard, EmptyShardAndMoves) {
  TempDir dir;
  write_token_shard(dir.path() / "empty.bin", {}, 256);
  TokenShard empty(dir.path() / "empty.bin");
  EXPECT_EQ(empty.size(), 0u);

  const std::vector<uint32_t> tokens = {5, 6, 7};
  write_token_shard(dir.path() / "c.bin", tokens, 256);
  TokenShard moved_from(dir.path() / "c.bin");
  TokenShard moved(std::move(moved_from));
  EXPECT_EQ(moved.token(2), 7u);
  empty = std::move(moved);
  EXPECT_EQ(empty.size(), 3u);
  EXPECT_EQ(empty.token(0), 5u);
  std::vector<TokenShard> shards;
  shards.push_back(std::move(empty));
  shards.emplace_back(dir.path() / "c.bin");
  EXPECT_EQ(shards[0].token(1), 6u);
}

TEST(TokenShard, WriteRejectsTokensOutsideTheVocabulary) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {1, 2, 300};
  const std::string message =
      error_message([&] { write_token_shard(dir.path() / "x.bin", tokens, 256); });
  EXPECT_TRUE(contains(message, "300")) << message;
  EXPECT_FALSE(fs::exists(dir.path() / "x.bin"));  // nothing half-written
}

TEST(TokenShard, BadMagicIsAClearError) {
  TempDir dir;
  write_file_atomic(dir.path() / "text.bin", "this is plain text, not a shard at all");
  std::string message = error_message([&] { TokenShard shard(dir.path() / "text.bin"); });
  EXPECT_TRUE(contains(message, "bad magic")) << message;
  EXPECT_TRUE(contains(message, "text.bin")) << message;
  EXPECT_TRUE(contains(message, "brigade data prepare")) << message;

  write_file_atomic(dir.path() / "tiny.bin", "BRG");
  message = error_message([&] { TokenShard shard(dir.path() / "tiny.bin"); });
  EXPECT_TRUE(contains(message, "bad magic")) << message;

  message = error_message([&] { TokenShard shard(dir.path() / "missing.bin"); });
  EXPECT_TRUE(contains(message, "missing.bin")) << message;
  EXPECT_TRUE(contains(message, "no such file")) << message;
}

TEST(TokenShard, TruncatedFileIsAClearError) {
  TempDir dir;
  const fs::path path = dir.path() / "t.bin";
  write_token_shard(path, std::vector<uint32_t>(1000, 3), 256);
  fs::resize_file(path, kTokenShardHeaderBytes + 2 * 600 + 1);
  std::string message = error_message([&] { TokenShard shard(path); });
  EXPECT_TRUE(contains(message, "truncated")) << message;
  EXPECT_TRUE(contains(message, "header says 1000 tokens but file holds 600")) << message;

  fs::resize_file(path, 20);  // not even a whole header
  message = error_message([&] { TokenShard shard(path); });
  EXPECT_TRUE(contains(message, "truncated")) << message;
}

TEST(TokenShard, WrongVersionAndDtypeAreClearErrors) {
  TempDir dir;
  const fs::path path = dir.path() / "v.bin";
  write_token_shard(path, std::vector<uint32_t>(10, 1), 256);
  std::string bytes = read_file(path);
  bytes[8] = 7;  // version
  write_file_atomic(path, bytes);
  std::string message = error_message([&] { TokenShard shard(path); });
  EXPECT_TRUE(contains(message, "version 7")) << message;

  bytes[8] = 1;
  bytes[12] = 9;  // dtype
  write_file_atomic(path, bytes);
  message = error_message([&] { TokenShard shard(path); });
  EXPECT_TRUE(contains(message, "dtype")) << message;

  bytes[12] = 1;
  write_file_atomic(path, bytes + "xx");
  message = error_message([&] { TokenShard shard(path); });
  EXPECT_TRUE(contains(message, "2 bytes after the 10 tokens")) << message;

  write_file_atomic(path, bytes);
  EXPECT_EQ(TokenShard(path).size(), 10u);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade

// Token shards: the on-disk form of tokenized text.
//
// A shard is a 32-byte little-endian header followed by the tokens:
//
//   offset  size  field
//        0     8  magic "BRGDTOK\0"
//        8     4  version (1)
//       12     4  token width code: 1 = uint16, 2 = uint32
//       16     8  token count
//       24     8  vocabulary size of the tokenizer that wrote it
//       32     -  tokens
//
// Shards are read through mmap, so opening one costs nothing however large it
// is, and a window of tokens is a single strided copy out of the page cache.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace brigade {

inline constexpr char kTokenShardMagic[8] = {'B', 'R', 'G', 'D', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;

enum class TokenDtype : uint32_t { kUint16 = 1, kUint32 = 2 };

// Writes `tokens` to `path` atomically, 2 bytes per token when vocab_size <=
// 65536, else 4. Throws Error if a token is >= vocab_size.
void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                       uint32_t vocab_size);

// A read-only, memory-mapped shard. Opening validates the header against the
// file's size, so a shard that opens holds every token its header promises.
class TokenShard {
 public:
  // Throws Error naming the path if the file is missing, is not a shard,
  // has another version or width code, or is truncated.
  explicit TokenShard(std::filesystem::path path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return num_tokens_; }
  uint32_t vocab_size() const { return vocab_size_; }
  TokenDtype dtype() const { return dtype_; }

  // Token i, i < size().
  uint32_t token(uint64_t i) const;

  // Copies tokens [offset, offset + count) into out[0, count), as int32 (the
  // index type the model's embedding lookup takes). The range must lie in
  // the shard.
  void copy_window(uint64_t offset, uint64_t count, int32_t* out) const;

 private:
  void unmap();

  std::filesystem::path path_;
  const uint8_t* mapping_ = nullptr;  // the whole file
  size_t mapping_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;  // mapping_ + header
  uint64_t num_tokens_ = 0;
  uint32_t vocab_size_ = 0;
  TokenDtype dtype_ = TokenDtype::kUint16;
};

}  // namespace brigade

#include "brigade/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;

// The format is little-endian and read by casting mapped memory.
static_assert(std::endian::native == std::endian::little,
              "token shards are read in place and assume a little-endian host");

namespace {

constexpr size_t kVersionOffset = 8, kDtypeOffset = 12, kCountOffset = 16, kVocabOffset = 24;

size_t dtype_width_bytes(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? 2 : 4;
}

template <typename T>
T load_field(const uint8_t* header, size_t offset) {
  T value;
  std::memcpy(&value, header + offset, sizeof(T));
  return value;
}

template <typename T>
void store_field(uint8_t* header, size_t offset, T value) {
  std::memcpy(header + offset, &value, sizeof(T));
}

template <typename T>
void write_tokens_as(AtomicFileWriter& writer, std::span<const uint32_t> tokens) {
  constexpr size_t kChunkTokens = 1 << 16;
  std::vector<T> chunk(std::min(tokens.size(), kChunkTokens));
  for (size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    const size_t count = std::min(kChunkTokens, tokens.size() - begin);
    for (size_t i = 0; i < count; ++i) chunk[i] = static_cast<T>(tokens[begin + i]);
    writer.write(chunk.data(), count * sizeof(T));
  }
}

}  // namespace

void write_token_shard(const fs::path& path, std::span<const uint32_t> tokens,
                       uint32_t vocab_size) {
  BRIGADE_CHECK(vocab_size > 0, "a token shard needs a vocabulary size");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) [[unlikely]] {
      throw_error("cannot write {}: token {} at position {} is outside the vocabulary of {}",
                  path.string(), tokens[i], i, vocab_size);
    }
  }
  const TokenDtype dtype = vocab_size <= 65536 ? TokenDtype::kUint16 : TokenDtype::kUint32;

  uint8_t header[kTokenShardHeaderBytes] = {};
  std::memcpy(header, kTokenShardMagic, sizeof(kTokenShardMagic));
  store_field<uint32_t>(header, kVersionOffset, kTokenShardVersion);
  store_field<uint32_t>(header, kDtypeOffset, static_cast<uint32_t>(dtype));
  store_field<uint64_t>(header, kCountOffset, tokens.size());
  store_field<uint64_t>(header, kVocabOffset, vocab_size);

  AtomicFileWriter writer(path);
  writer.write(header, sizeof(header));
  if (dtype == TokenDtype::kUint16) {
    write_tokens_as<uint16_t>(writer, tokens);
  } else {
    writer.write(tokens.data(), tokens.size_bytes());
  }
  writer.commit();
}

TokenShard::TokenShard(fs::path path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_error("cannot open token shard {}: {}", path_.string(),
                errno == ENOENT ? "no such file" : std::strerror(errno));
  }
  // Closed on every path out; the mapping outlives the descriptor.
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw_error("cannot stat {}: {}", path_.string(), std::strerror(errno));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  uint8_t header[kTokenShardHeaderBytes] = {};
  const ssize_t header_read = ::pread(fd, header, sizeof(header), 0);
  if (header_read < 0) throw_error("cannot read {}: {}", path_.string(), std::strerror(errno));
  if (static_cast<size_t>(header_read) < sizeof(kTokenShardMagic) ||
      std::memcmp(header, kTokenShardMagic, sizeof(kTokenShardMagic)) != 0) {
    throw_error("{} is not a Brigade token shard (bad magic): make it with `brigade data prepare`",
                path_.string());
  }
  if (static_cast<size_t>(header_read) < kTokenShardHeaderBytes) {
    throw_error("{} is truncated: it holds {} bytes, less than the {}-byte token shard header",
                path_.string(), header_read, kTokenShardHeaderBytes);
  }
  const uint32_t version = load_field<uint32_t>(header, kVersionOffset);
  if (version != kTokenShardVersion) {
    throw_error(
        "{} is a version {} token shard, but this Brigade reads version {}: prepare the data "
        "again with `brigade data prepare`",
        path_.string(), version, kTokenShardVersion);
  }
  const uint32_t dtype_code = load_field<uint32_t>(header, kDtypeOffset);
  if (dtype_code != static_cast<uint32_t>(TokenDtype::kUint16) &&
      dtype_code != static_cast<uint32_t>(TokenDtype::kUint32)) {
    throw_error(
        "{} has token dtype code {}, expected 1 (uint16) or 2 (uint32): the file is corrupt",
        path_.string(), dtype_code);
  }
  dtype_ = static_cast<TokenDtype>(dtype_code);
  num_tokens_ = load_field<uint64_t>(header, kCountOffset);
  const uint64_t vocab_size = load_field<uint64_t>(header, kVocabOffset);
  if (vocab_size == 0 || vocab_size > UINT32_MAX) {
    throw_error("{} records a vocabulary size of {}: the file is corrupt", path_.string(),
                vocab_size);
  }
  vocab_size_ = static_cast<uint32_t>(vocab_size);

  const uint64_t width = dtype_width_bytes(dtype_);
  const uint64_t payload_bytes = file_bytes - kTokenShardHeaderBytes;
  // Compared by division so a corrupt count cannot overflow the product.
  const uint64_t tokens_held = payload_bytes / width;
  if (num_tokens_ > tokens_held) {
    throw_error("{} is truncated: header says {} tokens but file holds {}", path_.string(),
                num_tokens_, tokens_held);
  }
  if (payload_bytes != num_tokens_ * width) {
    throw_error("{} has {} bytes after the {} tokens its header promises: the file is corrupt",
                path_.string(), payload_bytes - num_tokens_ * width, num_tokens_);
  }

  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    throw_error("cannot map {}: {}", path_.string(), std::strerror(errno));
  }
  mapping_ = static_cast<const uint8_t*>(mapping);
  mapping_bytes_ = file_bytes;
  tokens_ = mapping_ + kTokenShardHeaderBytes;
}

TokenShard::~TokenShard() {
  unmap();
}

TokenShard::TokenShard(TokenShard&& other) noexcept {
  *this = std::move(other);
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    vocab_size_ = other.vocab_size_;
    dtype_ = other.dtype_;
  }
  return *this;
}

void TokenShard::unmap() {
  if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_bytes_);
  mapping_ = nullptr;
  tokens_ = nullptr;
}

uint32_t TokenShard::token(uint64_t i) const {
  BRIGADE_CHECK(i < num_tokens_, "token {} of {} in {}", i, num_tokens_, path_.string());
  if (dtype_ == TokenDtype::kUint16) return reinterpret_cast<const uint16_t*>(tokens_)[i];
  return reinterpret_cast<const uint32_t*>(tokens_)[i];
}

void TokenShard::copy_window(uint64_t offset, uint64_t count, int32_t* out) const {
  BRIGADE_CHECK(offset <= num_tokens_ && count <= num_tokens_ - offset,
                "window [{}, {}) outside the {} tokens of {}", offset, offset + count, num_tokens_,
                path_.string());
  if (dtype_ == TokenDtype::kUint16) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(tokens_) + offset;
    for (uint64_t i = 0; i < count; ++i) out[i] = src[i];
  } else {
    // Token ids fit int32: write_token_shard checks them against a uint32
    // vocabulary size, and models take vocabularies far below 2^31.
    std::memcpy(out, reinterpret_cast<const uint32_t*>(tokens_) + offset, count * sizeof(int32_t));
  }
}

}  // namespace brigade

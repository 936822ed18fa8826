// ByteTokenizer: token id = byte value. No training, no files, and no text it
// cannot round-trip, which makes it the tokenizer of choice for tests and for
// small character-level models.
#pragma once

#include "brigade/data/tokenizer.h"

namespace brigade {

class ByteTokenizer final : public Tokenizer {
 public:
  // A vocabulary smaller than 256 (e.g. 128 for ASCII-only models) makes
  // encode() reject bytes at or above it. vocab_size must be in [1, 256].
  explicit ByteTokenizer(uint32_t vocab_size = 256);

  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> tokens) const override;
  uint32_t vocab_size() const override { return vocab_size_; }
  std::string spec() const override { return std::string(kByteTokenizerSpec); }

 private:
  uint32_t vocab_size_;
};

}  // namespace brigade

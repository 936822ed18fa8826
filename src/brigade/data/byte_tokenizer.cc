#include "brigade/data/byte_tokenizer.h"

#include "brigade/core/error.h"

namespace brigade {

ByteTokenizer::ByteTokenizer(uint32_t vocab_size) : vocab_size_(vocab_size) {
  if (vocab_size < 1 || vocab_size > 256) {
    throw_error("a byte tokenizer's vocabulary must hold 1 to 256 tokens, not {}", vocab_size);
  }
}

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const uint32_t byte = static_cast<unsigned char>(text[i]);
    if (byte >= vocab_size_) [[unlikely]] {
      throw_error(
          "byte 0x{:02x} at offset {} is outside the tokenizer's vocabulary of {}: the byte "
          "tokenizer only encodes bytes below 0x{:02x}; remove or replace that character",
          byte, i, vocab_size_, vocab_size_);
    }
    tokens[i] = byte;
  }
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size_) [[unlikely]] {
      throw_error("token id {} at position {} is outside the byte tokenizer's vocabulary of {}",
                  tokens[i], i, vocab_size_);
    }
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

}  // namespace brigade

// Tokenizer: text <-> token ids.
//
// Two kinds exist. ByteTokenizer maps each byte to itself (vocabulary 256, or
// smaller). BpeTokenizer is GPT-2's byte-level BPE, reading and writing
// GPT-2's vocab.json + merges.txt. Both encode any byte string, valid UTF-8 or
// not, and decode(encode(text)) == text.
//
// A tokenizer is named by a spec string that reproduces it: "byte" or the
// directory that holds vocab.json and merges.txt. The spec is what a dataset
// and a checkpoint record, so eval and sampling use the tokenizer training
// used.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace brigade {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, each below vocab_size(). Throws Error if the text
  // holds a byte the vocabulary cannot express, naming the byte and its
  // offset. Safe to call from several threads at once.
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;

  // The bytes the tokens stand for. Throws Error for an id >= vocab_size().
  virtual std::string decode(std::span<const uint32_t> tokens) const = 0;

  // One more than the largest token id.
  virtual uint32_t vocab_size() const = 0;

  // "byte", or the directory the tokenizer was loaded from or saved to.
  virtual std::string spec() const = 0;
};

// The spec string of the byte tokenizer.
inline constexpr std::string_view kByteTokenizerSpec = "byte";

// "byte" -> ByteTokenizer; otherwise `spec` is a directory holding vocab.json
// and merges.txt -> BpeTokenizer. Throws Error naming the path if the
// directory or either file is missing or malformed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// Whether two specs name the same tokenizer: both "byte", or paths to the
// same directory however they are spelled (relative, absolute, with "..").
bool same_tokenizer_spec(const std::string& a, const std::string& b);

}  // namespace brigade

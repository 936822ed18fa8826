// BpeTokenizer: GPT-2's byte-level byte-pair encoding.
//
// Encoding a text takes three steps, as in GPT-2:
//  1. Pre-tokenize: cut the text into words with GPT-2's pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     (split_gpt2_pretokens below). Merges never cross a word boundary.
//  2. Spell each word as byte symbols, one per byte. GPT-2's files name byte b
//     by a printable code point (bytes_to_unicode: '!'..'~', U+00A1..U+00AC
//     and U+00AE..U+00FF stand for themselves; the other 68 bytes become
//     U+0100.., so a space is written "Ġ" (U+0120)).
//  3. Apply merges: repeatedly join the adjacent pair whose merge has the
//     lowest rank (its line in merges.txt), until no pair has a merge.
//
// So OpenAI's and Hugging Face's GPT-2 vocab.json + merges.txt load as they
// are, and files written by save() load in those tools too.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "brigade/data/tokenizer.h"

namespace brigade {

// GPT-2's pre-tokenization of `text`, as views into it. Their concatenation
// is `text`, byte for byte, for any bytes.
//
// The pattern is matched by hand over UTF-8 code points, with no regex
// library. Whitespace (\s) is Unicode's White_Space set exactly. Letters
// (\p{L}) and numbers (\p{N}) are exact for ASCII and Latin-1 and cover the
// common scripts (Latin extended, IPA, Greek, Cyrillic, Armenian, Hebrew,
// Arabic, Devanagari, Thai, Georgian, Hangul, Ethiopic syllables, kana, CJK
// ideographs, fullwidth forms; digits of Arabic, Devanagari, Bengali, Thai;
// super- and subscript digits, fractions, Roman and circled numerals). Code
// points outside these tables (rarer scripts, combining marks) count as
// neither letter nor number, i.e. as punctuation; so do bytes that are not
// valid UTF-8, one byte at a time. Text in the covered scripts splits as
// GPT-2 splits it.
std::vector<std::string_view> split_gpt2_pretokens(std::string_view text);

// The end of the pre-token that starts at `begin` (< text.size()).
size_t gpt2_pretoken_end(std::string_view text, size_t begin);

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads dir/vocab.json ({"token": id, ...}) and dir/merges.txt (one
  // "left right" pair per line, lowest rank first; a leading "#version" line
  // is skipped). Throws Error naming the file and line of anything malformed:
  // a merge whose parts or result are not in the vocabulary, a repeated id.
  static BpeTokenizer load(const std::filesystem::path& dir);

  // Learns merges from `text` until the vocabulary holds `vocab_size` tokens
  // (256 byte tokens, ids 0..255 = byte values, then one per merge), or until
  // no adjacent pair is left to merge. Each step merges the pair that occurs
  // most often across the text's pre-tokens; ties go to the pair with the
  // smaller (left id, right id), so training is deterministic.
  static BpeTokenizer train(std::string_view text, uint32_t vocab_size);

  // Writes dir/vocab.json and dir/merges.txt in GPT-2's format, each
  // atomically, and makes `dir` this tokenizer's spec.
  void save(const std::filesystem::path& dir);

  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> tokens) const override;
  uint32_t vocab_size() const override { return static_cast<uint32_t>(id_to_token_.size()); }
  // The directory loaded from or saved to; empty for a trained, unsaved one.
  std::string spec() const override { return spec_; }

  size_t num_merges() const { return merges_.size(); }
  // The vocabulary's spelling of token `id` (e.g. "Ġthe"); empty for an id
  // that vocab.json leaves unused.
  const std::string& token_string(uint32_t id) const { return id_to_token_.at(id); }

 private:
  static constexpr uint32_t kNoToken = UINT32_MAX;

  struct Merge {
    uint32_t rank;
    uint32_t result;
  };

  // `id_to_token` holds GPT-2 spellings (empty = an unused id).
  BpeTokenizer(std::vector<std::string> id_to_token, std::string spec);
  // `merges` are (left, right) id pairs in rank order; each joined spelling
  // must be in the vocabulary.
  void set_merges(std::vector<std::pair<uint32_t, uint32_t>> merges);

  // Appends the token ids of one pre-token to `out`.
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;
  [[noreturn]] void throw_missing_byte(std::string_view text) const;

  std::string spec_;
  std::vector<std::string> id_to_token_;  // GPT-2 spelling per id
  std::vector<std::string> id_to_bytes_;  // the bytes each id decodes to
  std::vector<bool> id_used_;
  std::unordered_map<std::string, uint32_t> token_to_id_;
  std::array<uint32_t, 256> byte_to_id_{};  // kNoToken where vocab.json lacks the byte
  bool all_bytes_known_ = true;
  std::vector<std::pair<uint32_t, uint32_t>> merges_;  // in rank order
  std::unordered_map<uint64_t, Merge> merge_of_pair_;  // key: left << 32 | right
};

}  // namespace brigade

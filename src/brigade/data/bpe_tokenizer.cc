#include "brigade/data/bpe_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <span>

#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------
// Character classes for the pre-tokenizer.

struct CodePointRange {
  uint32_t first, last;
};

// Subsets of Unicode's \p{L}: every code point listed is a letter; common
// scripts are covered whole, rarer ones not at all (see bpe_tokenizer.h).
constexpr CodePointRange kLetterRanges[] = {
    {0x41, 0x5A},       {0x61, 0x7A},     {0xAA, 0xAA},     {0xB5, 0xB5},     {0xBA, 0xBA},
    {0xC0, 0xD6},       {0xD8, 0xF6},     {0xF8, 0x2C1},    {0x2C6, 0x2D1},   {0x2E0, 0x2E4},
    {0x2EC, 0x2EC},     {0x2EE, 0x2EE},   {0x370, 0x374},   {0x376, 0x377},   {0x37A, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},   {0x388, 0x38A},   {0x38C, 0x38C},   {0x38E, 0x3A1},
    {0x3A3, 0x3F5},     {0x3F7, 0x481},   {0x48A, 0x52F},   {0x531, 0x556},   {0x559, 0x559},
    {0x560, 0x588},     {0x5D0, 0x5EA},   {0x5EF, 0x5F2},   {0x620, 0x64A},   {0x66E, 0x66F},
    {0x671, 0x6D3},     {0x6D5, 0x6D5},   {0x6E5, 0x6E6},   {0x6EE, 0x6EF},   {0x6FA, 0x6FC},
    {0x6FF, 0x6FF},     {0x904, 0x939},   {0x93D, 0x93D},   {0x950, 0x950},   {0x958, 0x961},
    {0x971, 0x980},     {0xE01, 0xE30},   {0xE32, 0xE33},   {0xE40, 0xE46},   {0x10A0, 0x10C5},
    {0x10C7, 0x10C7},   {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x3041, 0x3096}, {0x309D, 0x309F},
    {0x30A1, 0x30FA},   {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E}, {0x31F0, 0x31FF},
    {0x3400, 0x4DBF},   {0x4E00, 0x9FFF}, {0xA000, 0xA48C}, {0xAC00, 0xD7A3}, {0xF900, 0xFA6D},
    {0xFA70, 0xFAD9},   {0xFB00, 0xFB06}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE},
    {0x20000, 0x2A6DF},
};

// Subsets of Unicode's \p{N} (decimal digits, letter numbers, other numbers).
constexpr CodePointRange kNumberRanges[] = {
    {0x30, 0x39},     {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
    {0x6F0, 0x6F9},   {0x966, 0x96F},   {0x9E6, 0x9EF},   {0xE50, 0xE59},   {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B},
    {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A},
    {0xFF10, 0xFF19},
};

bool in_ranges(std::span<const CodePointRange> ranges, uint32_t code_point) {
  auto it = std::upper_bound(
      ranges.begin(), ranges.end(), code_point,
      [](uint32_t value, const CodePointRange& range) { return value < range.first; });
  return it != ranges.begin() && code_point <= std::prev(it)->last;
}

// Unicode's White_Space property, which is what \s matches in GPT-2's regex.
bool is_white_space(uint32_t code_point) {
  return (code_point >= 0x09 && code_point <= 0x0D) || code_point == 0x20 || code_point == 0x85 ||
         code_point == 0xA0 || code_point == 0x1680 ||
         (code_point >= 0x2000 && code_point <= 0x200A) || code_point == 0x2028 ||
         code_point == 0x2029 || code_point == 0x202F || code_point == 0x205F ||
         code_point == 0x3000;
}

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_code_point(uint32_t code_point) {
  if (is_white_space(code_point)) return CharClass::kSpace;
  if (in_ranges(kLetterRanges, code_point)) return CharClass::kLetter;
  if (in_ranges(kNumberRanges, code_point)) return CharClass::kNumber;
  return CharClass::kOther;
}

constexpr std::array<CharClass, 128> kAsciiClass = [] {
  std::array<CharClass, 128> table{};
  for (uint32_t c = 0; c < 128; ++c) {
    table[c] = (c >= 0x09 && c <= 0x0D) || c == ' '               ? CharClass::kSpace
               : (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? CharClass::kLetter
               : (c >= '0' && c <= '9')                           ? CharClass::kNumber
                                                                  : CharClass::kOther;
  }
  return table;
}();

struct CharAt {
  CharClass char_class;
  size_t length_bytes;
};

// Decodes the UTF-8 code point that starts at text[pos]. A byte that does not
// start a well-formed sequence (stray continuation byte, truncated or
// overlong sequence, surrogate, > U+10FFFF) is a one-byte kOther character,
// so any byte string can be pre-tokenized and reassembled.
CharAt char_at(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {kAsciiClass[lead], 1};
  size_t length;
  uint32_t code_point, min_code_point;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F, min_code_point = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F, min_code_point = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07, min_code_point = 0x10000;
  } else {
    return {CharClass::kOther, 1};
  }
  if (pos + length > text.size()) return {CharClass::kOther, 1};
  for (size_t i = 1; i < length; ++i) {
    const uint8_t next = byte(pos + i);
    if ((next & 0xC0) != 0x80) return {CharClass::kOther, 1};
    code_point = (code_point << 6) | (next & 0x3F);
  }
  if (code_point < min_code_point || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return {CharClass::kOther, 1};
  }
  return {classify_code_point(code_point), length};
}

// ---------------------------------------------------------------------------
// GPT-2's byte <-> printable code point mapping (bytes_to_unicode).

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Bytes that are printable and not whitespace in Latin-1 stand for
// themselves; the other 68 take code points 256, 257, ... in byte order.
constexpr std::array<uint32_t, 256> kByteToCodePoint = [] {
  std::array<uint32_t, 256> table{};
  uint32_t next_code_point = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool stands_for_itself =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = stands_for_itself ? b : next_code_point++;
  }
  return table;
}();

constexpr uint32_t kNumMappedCodePoints = 256 + 68;
constexpr int kNotAByte = -1;

constexpr std::array<int, kNumMappedCodePoints> kCodePointToByte = [] {
  std::array<int, kNumMappedCodePoints> table{};
  table.fill(kNotAByte);
  for (int b = 0; b < 256; ++b) table[kByteToCodePoint[b]] = b;
  return table;
}();

// The GPT-2 spelling of each single byte, e.g. " " -> "Ġ".
const std::array<std::string, 256>& byte_spellings() {
  static const std::array<std::string, 256> spellings = [] {
    std::array<std::string, 256> table;
    for (int b = 0; b < 256; ++b) append_utf8(table[b], kByteToCodePoint[b]);
    return table;
  }();
  return spellings;
}

std::string spell_bytes(std::string_view bytes) {
  std::string spelling;
  for (const char c : bytes) spelling += byte_spellings()[static_cast<uint8_t>(c)];
  return spelling;
}

// The bytes a vocabulary spelling stands for. Characters outside the byte
// mapping (possible in hand-added special tokens) stand for their own UTF-8.
std::string unspell(std::string_view spelling) {
  std::string bytes;
  size_t pos = 0;
  while (pos < spelling.size()) {
    const uint8_t lead = static_cast<uint8_t>(spelling[pos]);
    const size_t length = lead < 0x80             ? 1
                          : (lead & 0xE0) == 0xC0 ? 2
                          : (lead & 0xF0) == 0xE0 ? 3
                                                  : 4;
    uint32_t code_point = length == 1   ? lead
                          : length == 2 ? lead & 0x1F
                          : length == 3 ? lead & 0x0F
                                        : lead & 0x07;
    for (size_t i = 1; i < length && pos + i < spelling.size(); ++i) {
      code_point = (code_point << 6) | (static_cast<uint8_t>(spelling[pos + i]) & 0x3F);
    }
    if (code_point < kNumMappedCodePoints && kCodePointToByte[code_point] != kNotAByte) {
      bytes += static_cast<char>(kCodePointToByte[code_point]);
    } else {
      bytes += spelling.substr(pos, length);
    }
    pos += length;
  }
  return bytes;
}

uint64_t pair_key(uint32_t left, uint32_t right) {
  return (uint64_t{left} << 32) | right;
}

// The directory as an absolute path without a trailing separator, so the
// spec recorded in a dataset still works from another working directory.
std::string directory_spec(const fs::path& dir) {
  fs::path path = fs::absolute(dir).lexically_normal();
  if (!path.has_filename() && path.has_parent_path() && path != path.root_path()) {
    path = path.parent_path();
  }
  return path.string();
}

}  // namespace

// ---------------------------------------------------------------------------
// Pre-tokenization.

size_t gpt2_pretoken_end(std::string_view text, size_t begin) {
  const size_t size = text.size();
  BRIGADE_CHECK(begin < size);

  // 's|'t|'re|'ve|'m|'ll|'d  (lower case only, as in GPT-2)
  if (text[begin] == '\'' && begin + 1 < size) {
    const char c = text[begin + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return begin + 2;
    if (begin + 2 < size) {
      const char d = text[begin + 2];
      if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) {
        return begin + 3;
      }
    }
  }

  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': an optional space, then a run of
  // one class.
  size_t pos = begin + (text[begin] == ' ' ? 1 : 0);
  if (pos < size) {
    const CharAt first = char_at(text, pos);
    if (first.char_class != CharClass::kSpace) {
      pos += first.length_bytes;
      while (pos < size) {
        const CharAt next = char_at(text, pos);
        if (next.char_class != first.char_class) break;
        pos += next.length_bytes;
      }
      return pos;
    }
  }

  // '\s+(?!\S)|\s+': here text[begin] is whitespace. A run that reaches the
  // end is taken whole; otherwise its last character is left to lead the
  // next pre-token (so "a   b" gives "a", "  ", " b"), unless the run is that
  // one character.
  pos = begin;
  size_t last_char_begin = begin;
  while (pos < size) {
    const CharAt next = char_at(text, pos);
    if (next.char_class != CharClass::kSpace) break;
    last_char_begin = pos;
    pos += next.length_bytes;
  }
  if (pos == size || last_char_begin == begin) return pos;
  return last_char_begin;
}

std::vector<std::string_view> split_gpt2_pretokens(std::string_view text) {
  std::vector<std::string_view> pretokens;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = gpt2_pretoken_end(text, begin);
    pretokens.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return pretokens;
}

// ---------------------------------------------------------------------------
// Construction, loading, saving.

BpeTokenizer::BpeTokenizer(std::vector<std::string> id_to_token, std::string spec)
    : spec_(std::move(spec)), id_to_token_(std::move(id_to_token)) {
  const size_t num_ids = id_to_token_.size();
  BRIGADE_CHECK(num_ids < kNoToken);
  id_to_bytes_.resize(num_ids);
  id_used_.assign(num_ids, false);
  token_to_id_.reserve(num_ids);
  for (uint32_t id = 0; id < num_ids; ++id) {
    if (id_to_token_[id].empty()) continue;
    id_used_[id] = true;
    id_to_bytes_[id] = unspell(id_to_token_[id]);
    token_to_id_.emplace(id_to_token_[id], id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = token_to_id_.find(byte_spellings()[b]);
    byte_to_id_[b] = it == token_to_id_.end() ? kNoToken : it->second;
    if (byte_to_id_[b] == kNoToken) all_bytes_known_ = false;
  }
}

void BpeTokenizer::set_merges(std::vector<std::pair<uint32_t, uint32_t>> merges) {
  merges_ = std::move(merges);
  merge_of_pair_.clear();
  merge_of_pair_.reserve(merges_.size());
  for (uint32_t rank = 0; rank < merges_.size(); ++rank) {
    const auto [left, right] = merges_[rank];
    const auto it = token_to_id_.find(id_to_token_.at(left) + id_to_token_.at(right));
    BRIGADE_CHECK(it != token_to_id_.end(), "merge {} has no result token", rank);
    // A repeated pair keeps its first (lowest) rank, as in GPT-2.
    merge_of_pair_.try_emplace(pair_key(left, right), Merge{rank, it->second});
  }
}

BpeTokenizer BpeTokenizer::load(const fs::path& dir) {
  const fs::path vocab_path = dir / "vocab.json";
  const fs::path merges_path = dir / "merges.txt";
  for (const fs::path& path : {vocab_path, merges_path}) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      throw_error(
          "tokenizer directory {} has no {}: a BPE tokenizer needs vocab.json and merges.txt in "
          "GPT-2's format (make them with `brigade tokenizer train`)",
          dir.string(), path.filename().string());
    }
  }

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_path));
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is not valid JSON: {}", vocab_path.string(), e.what());
  }
  if (!vocab.is_object()) {
    throw_error("{} must be a JSON object mapping token strings to ids", vocab_path.string());
  }
  // Far above any real vocabulary; guards against allocating for a typo.
  constexpr uint64_t kMaxTokenId = 1u << 24;
  std::vector<std::string> id_to_token;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= kMaxTokenId) {
      throw_error("{}: token \"{}\" has id {}, which is not an integer in [0, {})",
                  vocab_path.string(), token, value.dump(), kMaxTokenId);
    }
    if (token.empty()) throw_error("{}: holds an empty token string", vocab_path.string());
    const uint64_t id = value.get<uint64_t>();
    if (id >= id_to_token.size()) id_to_token.resize(id + 1);
    if (!id_to_token[id].empty()) {
      throw_error("{}: tokens \"{}\" and \"{}\" share id {}", vocab_path.string(), id_to_token[id],
                  token, id);
    }
    id_to_token[id] = token;
  }
  BpeTokenizer tokenizer(std::move(id_to_token), directory_spec(dir));

  const std::string merges_text = read_file(merges_path);
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  const auto find_token = [&](std::string_view token, size_t line_number) {
    const auto it = tokenizer.token_to_id_.find(std::string(token));
    if (it == tokenizer.token_to_id_.end()) {
      throw_error("{}:{}: token \"{}\" is not in vocab.json", merges_path.string(), line_number,
                  token);
    }
    return it->second;
  };
  size_t line_number = 0;
  for (size_t begin = 0; begin < merges_text.size();) {
    size_t end = merges_text.find('\n', begin);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw_error("{}:{}: expected two tokens separated by one space, found \"{}\"",
                  merges_path.string(), line_number, line);
    }
    const std::string_view left = line.substr(0, space), right = line.substr(space + 1);
    const uint32_t left_id = find_token(left, line_number);
    const uint32_t right_id = find_token(right, line_number);
    if (!tokenizer.token_to_id_.contains(std::string(left) + std::string(right))) {
      throw_error("{}:{}: merging \"{}\" and \"{}\" gives \"{}{}\", which is not in vocab.json",
                  merges_path.string(), line_number, left, right, left, right);
    }
    merges.emplace_back(left_id, right_id);
  }
  tokenizer.set_merges(std::move(merges));
  return tokenizer;
}

void BpeTokenizer::save(const fs::path& dir) {
  // Written by hand, in id order: nlohmann's ordered_json inserts in linear
  // time, too slow for a 50k vocabulary.
  std::string vocab_json = "{";
  for (uint32_t id = 0; id < id_to_token_.size(); ++id) {
    if (!id_used_[id]) continue;
    if (vocab_json.size() > 1) vocab_json += ", ";
    vocab_json += nlohmann::json(id_to_token_[id]).dump();
    vocab_json += fmt::format(": {}", id);
  }
  vocab_json += "}\n";
  std::string merges_txt = "#version: 0.2\n";
  for (const auto& [left, right] : merges_) {
    merges_txt += id_to_token_[left];
    merges_txt += ' ';
    merges_txt += id_to_token_[right];
    merges_txt += '\n';
  }
  write_file_atomic(dir / "vocab.json", vocab_json);
  write_file_atomic(dir / "merges.txt", merges_txt);
  spec_ = directory_spec(dir);
}

// ---------------------------------------------------------------------------
// Training.

BpeTokenizer BpeTokenizer::train(std::string_view text, uint32_t vocab_size) {
  if (vocab_size < 256) {
    throw_error("a BPE vocabulary needs at least 256 tokens (one per byte), not {}", vocab_size);
  }

  // Distinct pre-tokens with their counts, sorted so word indices (and all
  // that follows) do not depend on hash-table order.
  std::unordered_map<std::string_view, int64_t> pretoken_counts;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = gpt2_pretoken_end(text, begin);
    ++pretoken_counts[text.substr(begin, end - begin)];
    begin = end;
  }
  std::vector<std::pair<std::string_view, int64_t>> sorted_pretokens(pretoken_counts.begin(),
                                                                     pretoken_counts.end());
  std::sort(sorted_pretokens.begin(), sorted_pretokens.end());

  struct Word {
    std::vector<uint32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(sorted_pretokens.size());
  for (const auto& [pretoken, count] : sorted_pretokens) {
    Word word{{}, count};
    word.symbols.reserve(pretoken.size());
    for (const char c : pretoken) word.symbols.push_back(static_cast<uint8_t>(c));
    words.push_back(std::move(word));
  }

  // The vocabulary as raw bytes; ids 0..255 are the bytes themselves.
  std::vector<std::string> id_to_bytes(256);
  std::unordered_map<std::string, uint32_t> bytes_to_id;
  for (uint32_t b = 0; b < 256; ++b) {
    id_to_bytes[b] = std::string(1, static_cast<char>(b));
    bytes_to_id.emplace(id_to_bytes[b], b);
  }

  // Occurrences of each adjacent pair, weighted by word count, and the words
  // it may occur in (a superset: entries go stale as words are rewritten).
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;
  for (uint32_t w = 0; w < words.size(); ++w) {
    const std::vector<uint32_t>& symbols = words[w].symbols;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const uint64_t key = pair_key(symbols[i], symbols[i + 1]);
      pair_counts[key] += words[w].count;
      pair_words[key].push_back(w);
    }
  }

  // Max-heap of (count, pair) with lazy deletion: a count change pushes a new
  // entry, and popped entries whose count is out of date are skipped. Ties
  // go to the smaller pair key.
  struct Candidate {
    int64_t count;
    uint64_t pair;
    bool operator<(const Candidate& other) const {
      return count != other.count ? count < other.count : pair > other.pair;
    }
  };
  std::priority_queue<Candidate> heap;
  for (const auto& [key, count] : pair_counts) heap.push({count, key});

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  std::unordered_map<uint64_t, int64_t> count_deltas;
  while (id_to_bytes.size() < vocab_size && !heap.empty()) {
    const Candidate best = heap.top();
    heap.pop();
    const auto count_it = pair_counts.find(best.pair);
    if (count_it == pair_counts.end() || count_it->second != best.count) continue;

    const uint32_t left = static_cast<uint32_t>(best.pair >> 32);
    const uint32_t right = static_cast<uint32_t>(best.pair);
    // Two different pairs can spell the same bytes ("a"+"bc", "ab"+"c"); the
    // second then reuses the first's id, since vocab.json keys are unique.
    const auto [merged_it, is_new] = bytes_to_id.try_emplace(
        id_to_bytes[left] + id_to_bytes[right], static_cast<uint32_t>(id_to_bytes.size()));
    const uint32_t merged = merged_it->second;
    if (is_new) id_to_bytes.push_back(merged_it->first);
    merges.emplace_back(left, right);

    std::vector<uint32_t> candidate_words = std::move(pair_words[best.pair]);
    pair_words.erase(best.pair);
    std::sort(candidate_words.begin(), candidate_words.end());
    candidate_words.erase(std::unique(candidate_words.begin(), candidate_words.end()),
                          candidate_words.end());
    count_deltas.clear();
    for (const uint32_t w : candidate_words) {
      std::vector<uint32_t>& symbols = words[w].symbols;
      const int64_t count = words[w].count;
      bool found = false;
      for (size_t i = 0; i + 1 < symbols.size() && !found; ++i) {
        found = symbols[i] == left && symbols[i + 1] == right;
      }
      if (!found) continue;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        count_deltas[pair_key(symbols[i], symbols[i + 1])] -= count;
      }
      size_t out = 0;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          symbols[out++] = merged;
          ++i;
        } else {
          symbols[out++] = symbols[i];
        }
      }
      symbols.resize(out);
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const uint64_t key = pair_key(symbols[i], symbols[i + 1]);
        count_deltas[key] += count;
        if (symbols[i] == merged || symbols[i + 1] == merged) pair_words[key].push_back(w);
      }
    }
    for (const auto& [key, delta] : count_deltas) {
      if (delta == 0) continue;
      int64_t& count = pair_counts[key];
      count += delta;
      if (count > 0) {
        heap.push({count, key});
      } else {
        pair_counts.erase(key);
      }
    }
  }

  std::vector<std::string> id_to_token;
  id_to_token.reserve(id_to_bytes.size());
  for (const std::string& bytes : id_to_bytes) id_to_token.push_back(spell_bytes(bytes));
  BpeTokenizer tokenizer(std::move(id_to_token), /*spec=*/"");
  tokenizer.set_merges(std::move(merges));
  return tokenizer;
}

// ---------------------------------------------------------------------------
// Encoding and decoding.

void BpeTokenizer::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  const size_t size = word.size();
  if (size == 1) {
    out.push_back(byte_to_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  BRIGADE_CHECK(size < UINT32_MAX);

  // The word's symbols as a linked list over byte positions; a merged symbol
  // keeps the position of its left part.
  constexpr uint32_t kEnd = UINT32_MAX;
  struct Symbol {
    uint32_t id;
    uint32_t next;
    uint32_t prev;
  };
  std::vector<Symbol> symbols(size);
  for (uint32_t i = 0; i < size; ++i) {
    symbols[i] = {byte_to_id_[static_cast<uint8_t>(word[i])], i + 1 < size ? i + 1 : kEnd,
                  i > 0 ? i - 1 : kEnd};
  }

  // Pending merges, lowest rank first, then leftmost first. GPT-2 merges
  // every occurrence of the lowest-ranked pair, left to right, then looks
  // again; this queue does the same because a merge's result only forms pairs
  // of higher rank (in any merges.txt where a merge's parts come from earlier
  // merges, as in every file BPE training writes).
  struct Pending {
    uint32_t rank;
    uint32_t pos;
    uint32_t left, right;
    bool operator>(const Pending& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> pending;
  const auto push_pair = [&](uint32_t pos) {
    if (pos == kEnd || symbols[pos].next == kEnd) return;
    const uint32_t left = symbols[pos].id, right = symbols[symbols[pos].next].id;
    const auto it = merge_of_pair_.find(pair_key(left, right));
    if (it != merge_of_pair_.end()) pending.push({it->second.rank, pos, left, right});
  };
  for (uint32_t i = 0; i + 1 < size; ++i) push_pair(i);

  while (!pending.empty()) {
    const Pending top = pending.top();
    pending.pop();
    Symbol& symbol = symbols[top.pos];
    // Stale if either side has been merged into something else since.
    if (symbol.id != top.left || symbol.next == kEnd || symbols[symbol.next].id != top.right) {
      continue;
    }
    Symbol& absorbed = symbols[symbol.next];
    symbol.id = merge_of_pair_.at(pair_key(top.left, top.right)).result;
    symbol.next = absorbed.next;
    if (absorbed.next != kEnd) symbols[absorbed.next].prev = top.pos;
    absorbed.id = kNoToken;
    push_pair(symbol.prev);
    push_pair(top.pos);
  }
  for (uint32_t pos = 0; pos != kEnd; pos = symbols[pos].next) out.push_back(symbols[pos].id);
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  if (!all_bytes_known_) {
    for (const char c : text) {
      if (byte_to_id_[static_cast<uint8_t>(c)] == kNoToken) throw_missing_byte(text);
    }
  }
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size() / 3 + 16);
  // Words repeat (Zipf), so each distinct word is merged once per call: the
  // cache maps a word to where its tokens first landed in `tokens`. It lives
  // for one call, which keeps encode() thread-safe without a lock; a single
  // call over a whole corpus is where caching pays.
  struct Span {
    size_t begin, size;
  };
  std::unordered_map<std::string_view, Span> cache;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = gpt2_pretoken_end(text, begin);
    const std::string_view word = text.substr(begin, end - begin);
    begin = end;
    if (word.size() == 1) {
      tokens.push_back(byte_to_id_[static_cast<uint8_t>(word[0])]);
      continue;
    }
    const auto [it, is_new] = cache.try_emplace(word, Span{tokens.size(), 0});
    if (is_new) {
      encode_word(word, tokens);
      it->second.size = tokens.size() - it->second.begin;
    } else {
      const size_t old_size = tokens.size();
      tokens.resize(old_size + it->second.size);
      std::copy_n(tokens.begin() + it->second.begin, it->second.size, tokens.begin() + old_size);
    }
  }
  return tokens;
}

void BpeTokenizer::throw_missing_byte(std::string_view text) const {
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t byte = static_cast<uint8_t>(text[i]);
    if (byte_to_id_[byte] != kNoToken) continue;
    throw_error(
        "byte 0x{:02x} at offset {} has no token in the tokenizer's vocabulary: {}/vocab.json "
        "lacks the byte token \"{}\"; use a vocabulary that holds all 256 byte tokens",
        byte, i, spec_.empty() ? std::string("(unsaved tokenizer)") : spec_,
        byte_spellings()[byte]);
  }
  BRIGADE_CHECK(false, "throw_missing_byte found no missing byte");
}

std::string BpeTokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t id = tokens[i];
    if (id >= id_to_token_.size() || !id_used_[id]) [[unlikely]] {
      throw_error("token id {} at position {} is not in the tokenizer's vocabulary of {}", id, i,
                  id_to_token_.size());
    }
    text += id_to_bytes_[id];
  }
  return text;
}

}  // namespace brigade

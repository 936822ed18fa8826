#include "brigade/data/tokenizer.h"

#include <filesystem>

#include "brigade/core/error.h"
#include "brigade/data/bpe_tokenizer.h"
#include "brigade/data/byte_tokenizer.h"

namespace brigade {
namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == kByteTokenizerSpec) return std::make_unique<ByteTokenizer>();
  if (spec.empty()) {
    throw_error(
        "no tokenizer given: use \"byte\" or a directory holding vocab.json and merges.txt");
  }
  std::error_code ec;
  if (!fs::is_directory(spec, ec)) {
    throw_error(
        "tokenizer {} {}: expected \"byte\" or a directory holding vocab.json and "
        "merges.txt (make one with `brigade tokenizer train`)",
        spec, fs::exists(spec, ec) ? "is not a directory" : "does not exist");
  }
  return std::make_unique<BpeTokenizer>(BpeTokenizer::load(spec));
}

bool same_tokenizer_spec(const std::string& a, const std::string& b) {
  if (a == kByteTokenizerSpec || b == kByteTokenizerSpec) return a == b;
  std::error_code ec_a, ec_b;
  return std::filesystem::weakly_canonical(a, ec_a) == std::filesystem::weakly_canonical(b, ec_b);
}

}  // namespace brigade

// A prepared dataset: a directory of token shards plus dataset.json.
//
//   out_dir/
//     train_000.bin, train_001.bin, ...   training tokens, in text order
//     val.bin                             the held-out tail of the text
//     dataset.json                        written last: its presence means
//                                         every shard it lists is complete
//
// The validation split is the LAST val_fraction of the tokens, not a random
// sample, so no validation window overlaps text the model trained on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "brigade/data/token_shard.h"
#include "brigade/data/tokenizer.h"

namespace brigade {

// 256M tokens: 512 MB as uint16, small enough to map comfortably anywhere.
inline constexpr uint64_t kDefaultMaxShardTokens = uint64_t{1} << 28;

// What dataset.json records.
struct DatasetManifest {
  struct Shard {
    std::string file;  // relative to the dataset directory
    uint64_t num_tokens = 0;
  };
  std::string tokenizer_spec;
  uint32_t vocab_size = 0;
  std::string source;  // the text it was prepared from
  std::vector<Shard> train_shards;
  Shard val_shard;

  uint64_t train_tokens() const;
};

// Tokenizes the text file at `input_text_path` and writes the shards and
// dataset.json into `out_dir`. The last round(val_fraction * tokens) tokens
// become val.bin; the rest are cut into train shards of at most
// max_shard_tokens. Refuses (Error) an out_dir that already holds a
// dataset.json unless `overwrite`. Returns what it wrote into dataset.json.
DatasetManifest prepare_dataset(const std::filesystem::path& input_text_path,
                                const Tokenizer& tokenizer, const std::filesystem::path& out_dir,
                                double val_fraction = 0.1, bool overwrite = false,
                                uint64_t max_shard_tokens = kDefaultMaxShardTokens);

// An opened dataset directory. Opening maps every shard and checks it against
// dataset.json; any mismatch is an Error naming the file.
class Dataset {
 public:
  explicit Dataset(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const DatasetManifest& manifest() const { return manifest_; }
  const std::vector<TokenShard>& train_shards() const { return train_shards_; }
  const TokenShard& val_shard() const { return val_shard_; }
  uint32_t vocab_size() const { return manifest_.vocab_size; }
  const std::string& tokenizer_spec() const { return manifest_.tokenizer_spec; }
  uint64_t train_tokens() const { return manifest_.train_tokens(); }

 private:
  Dataset(std::filesystem::path dir, DatasetManifest manifest);

  std::filesystem::path dir_;
  DatasetManifest manifest_;
  std::vector<TokenShard> train_shards_;
  TokenShard val_shard_;
};

}  // namespace brigade

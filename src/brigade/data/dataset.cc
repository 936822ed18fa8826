#include "brigade/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kManifestName = "dataset.json";
constexpr std::string_view kManifestFormat = "brigade-dataset";
constexpr int kManifestVersion = 1;

std::string train_shard_name(size_t index) {
  return fmt::format("train_{:03d}.bin", index);
}

bool is_train_shard_name(const std::string& name) {
  if (!name.starts_with("train_") || !name.ends_with(".bin")) return false;
  const std::string_view digits(name.data() + 6, name.size() - 10);
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

nlohmann::json shard_json(const DatasetManifest::Shard& shard) {
  return {{"file", shard.file}, {"tokens", shard.num_tokens}};
}

DatasetManifest::Shard parse_shard(const nlohmann::json& json) {
  return {json.at("file").get<std::string>(), json.at("tokens").get<uint64_t>()};
}

DatasetManifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw_error("dataset directory {} does not exist: make it with `brigade data prepare`",
                dir.string());
  }
  if (!fs::exists(path, ec)) {
    throw_error(
        "{} holds no {}: it is not a prepared dataset (or its preparation did not "
        "finish); make it with `brigade data prepare`",
        dir.string(), kManifestName);
  }
  try {
    const nlohmann::json json = nlohmann::json::parse(read_file(path));
    if (json.value("format", "") != kManifestFormat) {
      throw_error("{} is not a Brigade dataset manifest (no \"format\": \"{}\")", path.string(),
                  kManifestFormat);
    }
    const int version = json.at("version").get<int>();
    if (version != kManifestVersion) {
      throw_error("{} has version {}, but this Brigade reads version {}: prepare the data again",
                  path.string(), version, kManifestVersion);
    }
    DatasetManifest manifest;
    manifest.tokenizer_spec = json.at("tokenizer").get<std::string>();
    manifest.vocab_size = json.at("vocab_size").get<uint32_t>();
    manifest.source = json.value("source", "");
    for (const nlohmann::json& shard : json.at("train")) {
      manifest.train_shards.push_back(parse_shard(shard));
    }
    manifest.val_shard = parse_shard(json.at("val"));
    return manifest;
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is malformed: {}", path.string(), e.what());
  }
}

// Opens one shard and checks it holds what the manifest says it does.
TokenShard open_listed_shard(const fs::path& dir, const DatasetManifest& manifest,
                             const DatasetManifest::Shard& listed) {
  TokenShard shard(dir / listed.file);
  if (shard.size() != listed.num_tokens) {
    throw_error("{} holds {} tokens but {} lists {}: the dataset is inconsistent; prepare it again",
                shard.path().string(), shard.size(), kManifestName, listed.num_tokens);
  }
  if (shard.vocab_size() != manifest.vocab_size) {
    throw_error(
        "{} was written for a vocabulary of {} but {} says {}: the dataset is inconsistent; "
        "prepare it again",
        shard.path().string(), shard.vocab_size(), kManifestName, manifest.vocab_size);
  }
  return shard;
}

}  // namespace

uint64_t DatasetManifest::train_tokens() const {
  uint64_t total = 0;
  for (const Shard& shard : train_shards) total += shard.num_tokens;
  return total;
}

DatasetManifest prepare_dataset(const fs::path& input_text_path, const Tokenizer& tokenizer,
                                const fs::path& out_dir, double val_fraction, bool overwrite,
                                uint64_t max_shard_tokens) {
  const fs::path manifest_path = out_dir / kManifestName;
  const bool had_manifest = fs::exists(manifest_path);
  if (had_manifest && !overwrite) {
    throw_error("{} already holds a prepared dataset ({}): pass --overwrite to replace it",
                out_dir.string(), kManifestName);
  }
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw_error("the validation fraction must be in [0, 1), not {}", val_fraction);
  }
  BRIGADE_CHECK(max_shard_tokens > 0);
  const std::string spec = tokenizer.spec();
  if (spec.empty()) {
    throw_error("the tokenizer has not been saved: save it to a directory before preparing data");
  }

  const std::string text = read_file(input_text_path);
  const std::vector<uint32_t> tokens = tokenizer.encode(text);
  const uint64_t num_val =
      static_cast<uint64_t>(std::llround(val_fraction * static_cast<double>(tokens.size())));
  const uint64_t num_train = tokens.size() - num_val;
  if (num_train == 0) {
    throw_error("{} holds {} tokens, leaving none for training: use more text{}",
                input_text_path.string(), tokens.size(),
                tokens.empty() ? "" : " or a smaller --val-fraction");
  }

  DatasetManifest manifest;
  manifest.tokenizer_spec = spec;
  manifest.vocab_size = tokenizer.vocab_size();
  manifest.source = fs::absolute(input_text_path).lexically_normal().string();

  // Without a manifest the directory is not a dataset, so a crash below
  // cannot leave one that mixes old and new shards.
  if (had_manifest) fs::remove(manifest_path);

  const std::span<const uint32_t> all(tokens);
  for (uint64_t begin = 0; begin < num_train; begin += max_shard_tokens) {
    const uint64_t count = std::min(max_shard_tokens, num_train - begin);
    DatasetManifest::Shard shard{train_shard_name(manifest.train_shards.size()), count};
    write_token_shard(out_dir / shard.file, all.subspan(begin, count), manifest.vocab_size);
    manifest.train_shards.push_back(std::move(shard));
  }
  manifest.val_shard = {"val.bin", num_val};
  write_token_shard(out_dir / manifest.val_shard.file, all.subspan(num_train), manifest.vocab_size);

  if (had_manifest) {
    // Train shards of the replaced dataset beyond the new count.
    for (const fs::directory_entry& entry : fs::directory_iterator(out_dir)) {
      const std::string name = entry.path().filename().string();
      if (!is_train_shard_name(name)) continue;
      const bool listed =
          std::any_of(manifest.train_shards.begin(), manifest.train_shards.end(),
                      [&](const DatasetManifest::Shard& shard) { return shard.file == name; });
      if (!listed) fs::remove(entry.path());
    }
  }

  nlohmann::json json = {
      {"format", kManifestFormat},
      {"version", kManifestVersion},
      {"tokenizer", manifest.tokenizer_spec},
      {"vocab_size", manifest.vocab_size},
      {"source", manifest.source},
      {"val_fraction", val_fraction},
      {"train_tokens", num_train},
      {"train", nlohmann::json::array()},
      {"val", shard_json(manifest.val_shard)},
  };
  for (const DatasetManifest::Shard& shard : manifest.train_shards) {
    json["train"].push_back(shard_json(shard));
  }
  write_file_atomic(manifest_path, json.dump(2) + "\n");
  return manifest;
}

Dataset::Dataset(const fs::path& dir) : Dataset(dir, read_manifest(dir)) {}

Dataset::Dataset(fs::path dir, DatasetManifest manifest)
    : dir_(std::move(dir)),
      manifest_(std::move(manifest)),
      val_shard_(open_listed_shard(dir_, manifest_, manifest_.val_shard)) {
  if (manifest_.train_shards.empty()) {
    throw_error("{} lists no train shards: prepare the dataset again",
                (dir_ / kManifestName).string());
  }
  train_shards_.reserve(manifest_.train_shards.size());
  for (const DatasetManifest::Shard& listed : manifest_.train_shards) {
    train_shards_.push_back(open_listed_shard(dir_, manifest_, listed));
  }
}

}  // namespace brigade

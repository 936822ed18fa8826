#include "brigade/ckpt/node_part.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <string>

#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;
namespace {

constexpr char kFormat[] = "brigade-node-part-1";

fs::path shard_path(const fs::path& dir, int rank) {
  return dir / partial_shard_path("", 0, rank).filename();
}
fs::path index_path(const fs::path& dir, int rank) {
  return shard_path(dir, rank).replace_extension(".json");
}

nlohmann::json part_json(const NodePart& p) {
  nlohmann::json j = {
      {"format", kFormat},          {"step", p.step},   {"node", p.node},
      {"first_rank", p.first_rank}, {"ranks", p.ranks}, {"num_shards", p.num_shards},
      {"model", p.config.to_json()}};
  if (p.header) {
    j["header"] = {{"mesh", p.header->mesh},
                   {"trainer_state", p.header->trainer_state},
                   {"tokenizer", p.header->tokenizer_spec}};
  }
  return j;
}

// Complete part directories under root, oldest first.
std::vector<fs::path> part_dirs(const fs::path& root) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("step_") && name.ends_with(".part") &&
        fs::exists(entry.path() / kNodePartFile)) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort by step
  return dirs;
}

}  // namespace

fs::path node_part_directory(const fs::path& root, int64_t step) {
  fs::path dir = step_directory(root, step);
  dir += ".part";
  return dir;
}

void pin_node_part(const fs::path& root, int64_t step) {
  write_file_atomic(root / kNodePartPinFile, std::to_string(step));
}

void unpin_node_part(const fs::path& root, int64_t step) {
  if (pinned_node_part(root) != step) return;
  std::error_code ec;
  fs::remove(root / kNodePartPinFile, ec);
}

std::optional<int64_t> pinned_node_part(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root / kNodePartPinFile, ec)) return std::nullopt;
  try {
    const std::string text = read_file(root / kNodePartPinFile);
    int64_t step = -1;
    const char* end = text.data() + text.size();
    if (text.empty() || std::from_chars(text.data(), end, step).ptr != end || step < 0) {
      return std::nullopt;
    }
    return step;
  } catch (const Error&) {
    return std::nullopt;  // removed meanwhile
  }
}

fs::path commit_node_part(const fs::path& root, const NodePart& part, int64_t keep, bool recycle) {
  const fs::path partial = partial_shard_path(root, part.step, part.first_rank).parent_path();
  for (int r = part.first_rank; r < part.first_rank + part.ranks; ++r) {
    if (!fs::exists(index_path(partial, r))) {
      throw_error("snapshot part {}: rank {} wrote no shard ({} is missing)", partial.string(), r,
                  index_path(partial, r).filename().string());
    }
  }
  write_file_atomic(partial / kNodePartFile, part_json(part).dump(1));
  const fs::path final_dir = node_part_directory(root, part.step);
  fs::remove_all(final_dir);
  fs::rename(partial, final_dir);
  if (keep > 0) {
    const std::vector<fs::path> dirs = part_dirs(root);
    const std::optional<int64_t> pinned = pinned_node_part(root);
    for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i) {
      if (pinned && dirs[i] == node_part_directory(root, *pinned)) continue;
      // Renamed first, in one step: a prune cut short leaves no part.json
      // whose shards are half gone.
      fs::path doomed = dirs[i];
      doomed += ".pruned";
      fs::rename(dirs[i], doomed);
      if (recycle) {
        const fs::path spare = root / "spare";
        fs::create_directories(spare);
        for (const auto& entry : fs::directory_iterator(doomed)) {
          if (entry.path().extension() == ".safetensors" && entry.is_regular_file()) {
            fs::rename(entry.path(), spare / entry.path().filename());
          }
        }
      }
      fs::remove_all(doomed);
    }
  }
  return final_dir;
}

NodePart read_node_part(const fs::path& part_dir) {
  const fs::path file = part_dir / kNodePartFile;
  NodePart p;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(file));
    if (j.at("format") != kFormat) {
      throw_error("format is {}, expected {}", j.at("format").dump(), kFormat);
    }
    p.step = j.at("step").get<int64_t>();
    p.node = j.at("node").get<int>();
    p.first_rank = j.at("first_rank").get<int>();
    p.ranks = j.at("ranks").get<int>();
    p.num_shards = j.at("num_shards").get<int>();
    p.config = GptConfig::from_json(j.at("model"));
    if (j.contains("header")) {
      const nlohmann::json& h = j.at("header");
      p.header = CheckpointHeader{h.at("mesh"), h.at("trainer_state"),
                                  h.at("tokenizer").get<std::string>()};
    }
  } catch (const Error& e) {
    throw_error("snapshot part {}: {}", file.string(), e.what());
  } catch (const std::exception& e) {
    throw_error("snapshot part {} is malformed: {}", file.string(), e.what());
  }
  if (p.node < 0 || p.num_shards < 1 || p.ranks < 1 || p.first_rank < 0 ||
      p.first_rank + p.ranks > p.num_shards) {
    throw_error("snapshot part {}: ranks [{}, {}) of node {} are not within the job's {} shards",
                file.string(), p.first_rank, p.first_rank + p.ranks, p.node, p.num_shards);
  }
  if (step_directory("", p.step).filename().string() + ".part" != part_dir.filename().string()) {
    throw_error("snapshot part {} says step {}, not its directory's", file.string(), p.step);
  }
  for (int r = p.first_rank; r < p.first_rank + p.ranks; ++r) {
    for (const fs::path& f : {shard_path(part_dir, r), index_path(part_dir, r)}) {
      if (!fs::is_regular_file(f)) {
        throw_error("snapshot part {} lacks {}, rank {}'s", part_dir.string(),
                    f.filename().string(), r);
      }
    }
  }
  return p;
}

std::vector<int64_t> node_part_steps(const fs::path& root) {
  std::vector<int64_t> steps;
  for (const fs::path& dir : part_dirs(root)) {
    fs::path name = dir.filename();
    steps.push_back(checkpoint_step(name.replace_extension()));
  }
  return steps;
}

fs::path assemble_checkpoint(const std::vector<fs::path>& parts, const fs::path& root) {
  if (parts.empty()) throw_error("no snapshot parts to assemble under {}", root.string());
  std::vector<NodePart> read;
  for (const fs::path& dir : parts) read.push_back(read_node_part(dir));
  const NodePart& first = read.front();
  std::map<int, size_t> owner;  // rank -> its part
  const CheckpointHeader* header = nullptr;
  for (size_t i = 0; i < read.size(); ++i) {
    const NodePart& p = read[i];
    if (p.step != first.step || p.num_shards != first.num_shards ||
        p.config.to_json() != first.config.to_json()) {
      throw_error(
          "snapshot parts {} and {} do not belong together (step {} of {} shards against step {} "
          "of {}, or another model)",
          parts.front().string(), parts[i].string(), first.step, first.num_shards, p.step,
          p.num_shards);
    }
    for (int r = p.first_rank; r < p.first_rank + p.ranks; ++r) {
      if (!owner.emplace(r, i).second) {
        throw_error("snapshot parts {} and {} both hold rank {}'s shard", parts[owner[r]].string(),
                    parts[i].string(), r);
      }
    }
    if (p.header && p.first_rank == 0) header = &*p.header;
  }
  for (int r = 0; r < first.num_shards; ++r) {
    if (!owner.contains(r)) {
      throw_error("snapshot step {}: no part holds rank {}'s shard (of {})", first.step, r,
                  first.num_shards);
    }
  }
  if (header == nullptr) {
    throw_error("snapshot step {}: the part holding rank 0 carries no header", first.step);
  }
  const fs::path partial = partial_shard_path(root, first.step, 0).parent_path();
  fs::create_directories(root);
  fs::remove_all(partial);
  try {
    fs::create_directory(partial);
    for (const auto& [rank, i] : owner) {
      for (const fs::path& f : {shard_path(parts[i], rank), index_path(parts[i], rank)}) {
        // A link, not a copy: the area is tmpfs, and a copy would hold the
        // whole state twice in memory while the parts are still there.
        std::error_code ec;
        fs::create_hard_link(f, partial / f.filename(), ec);
        if (ec) fs::copy_file(f, partial / f.filename());  // another file system
      }
    }
    return commit_checkpoint(root, first.step, first.num_shards, first.config, *header);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    throw;
  }
}

}  // namespace brigade

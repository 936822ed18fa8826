#include "brigade/ckpt/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepPrefix = "step_";
constexpr StateKind kKinds[] = {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq};

std::string shard_file(int rank) {
  return fmt::format("shard_{:05d}.safetensors", rank);
}
std::string shard_index_file(int rank) {
  return fmt::format("shard_{:05d}.json", rank);
}
fs::path partial_directory(const fs::path& root, int64_t step) {
  return root / fmt::format("{}{:08d}.partial", kStepPrefix, step);
}

// Where pruning keeps recycled shard files (ShardWriting).
fs::path spare_directory(const fs::path& root) {
  return root / "spare";
}

// Complete step directories under root, oldest first.
std::vector<fs::path> step_dirs(const fs::path& root) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.starts_with(kStepPrefix) &&
        name.find('.') == std::string::npos && fs::exists(entry.path() / "manifest.json")) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort by step
  return dirs;
}

}  // namespace

std::string state_tensor_name(StateKind kind, const std::string& param_name) {
  switch (kind) {
    case StateKind::kParams:
      return "model/" + param_name;
    case StateKind::kExpAvg:
      return "optim/exp_avg/" + param_name;
    case StateKind::kExpAvgSq:
      return "optim/exp_avg_sq/" + param_name;
  }
  return param_name;
}

int64_t checkpoint_step(const fs::path& step_dir) {
  const std::string name = step_dir.filename().string();
  return std::strtoll(name.c_str() + std::strlen(kStepPrefix), nullptr, 10);
}

fs::path step_directory(const fs::path& root, int64_t step) {
  return root / fmt::format("{}{:08d}", kStepPrefix, step);
}

void clear_checkpoint_leftovers(const fs::path& root) {
  // Leftovers of saves, replacements and prunes that died half-way: no save
  // is in flight now (the caller says so), so all are stale.
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  try {
    for (const auto& entry : fs::directory_iterator(root)) {
      const fs::path ext = entry.path().extension();
      if (ext == ".partial" || ext == ".old" || ext == ".pruned") fs::remove_all(entry.path());
    }
  } catch (const fs::filesystem_error& e) {
    throw_error("cannot clear the leftovers of earlier saves under {}: {}", root.string(),
                e.what());
  }
}

void create_checkpoint_directory(const fs::path& root, int64_t step) {
  const fs::path dir = partial_directory(root, step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  // A file in the way is no directory, whatever the library says of it.
  if (!ec && !fs::is_directory(dir, ec)) ec = std::make_error_code(std::errc::not_a_directory);
  if (ec) throw_error("cannot create the checkpoint directory {}: {}", dir.string(), ec.message());
}

void begin_checkpoint(const fs::path& root, int64_t step) {
  clear_checkpoint_leftovers(root);
  create_checkpoint_directory(root, step);
}

namespace {

// The part of a box of a tp rank's tensor `p` that lies in its run `part`
// along p.split_dim, intersected with local indices [x0, x1) there.
struct RunCut {
  TensorBox local;   // in the rank's tensor
  TensorBox global;  // the same elements in the global tensor
};

// A box of a rank's tensor, as boxes of the global tensor: cut where the
// rank's runs along split_dim end (c_attn's q, k, v), each run shifted to
// where it lies globally, padding left out.
std::vector<RunCut> global_cuts(const ParamInfo& p, const TensorBox& box) {
  if (p.replicated()) return {{box, box}};
  const auto d = static_cast<size_t>(p.split_dim);
  const int64_t run = p.shape[d] / static_cast<int64_t>(p.part_offsets.size());
  std::vector<RunCut> cuts;
  for (size_t part = 0; part < p.part_offsets.size(); ++part) {
    const int64_t run_begin = static_cast<int64_t>(part) * run;
    const int64_t x0 = std::max(box.offsets[d], run_begin);
    // Padding rows past the global tensor's end (a vocabulary tp does not
    // divide) are never written.
    const int64_t x1 = std::min(box.offsets[d] + box.sizes[d], run_begin + p.run_extent(part));
    if (x0 >= x1) continue;
    RunCut cut{box, box};
    cut.local.offsets[d] = x0;
    cut.local.sizes[d] = x1 - x0;
    cut.global.offsets[d] = p.part_offsets[part] + (x0 - run_begin);
    cut.global.sizes[d] = x1 - x0;
    cuts.push_back(std::move(cut));
  }
  return cuts;
}

}  // namespace

int64_t write_checkpoint_shard(const fs::path& root, int64_t step, int rank,
                               const GptConfig& config,
                               const std::vector<CheckpointPiece>& pieces) {
  return write_checkpoint_shard(root, step, rank, ParamLayout(config), pieces);
}

namespace {

// A shard's file as the pieces make it: its tensors, in file order, and the
// index's chunks.
struct ShardPlan {
  SafetensorsWriter writer;
  std::deque<std::vector<float>> repacked;  // a deque: the writer keeps pointers into them
  nlohmann::json chunks = nlohmann::json::array();
};

// False, and the plan incomplete, where a box needs repacking and `repack`
// is false (a claimed shard cannot hold one: claim_checkpoint_shard).
bool plan_shard(const ParamLayout& layout, const std::vector<CheckpointPiece>& pieces,
                ShardPlan& plan, bool repack = true) {
  // Each piece is stored whole, as one 1-D tensor; the chunks say which
  // elements of it belong to which box of which model tensor. A box of a
  // shard that a run boundary cuts across rows (c_attn's q|k|v columns) is
  // not contiguous in the piece: its elements are copied out into a tensor
  // of their own.
  for (const CheckpointPiece& piece : pieces) {
    const std::string key = fmt::format("{}@{}", state_tensor_name(piece.kind, ""), piece.begin);
    plan.writer.add_f32(key, {piece.end - piece.begin}, piece.data);
    for (const ParamInfo& p : layout.params()) {
      const int64_t begin = std::max(piece.begin, p.offset);
      const int64_t end = std::min(piece.end, p.offset + p.numel);
      if (begin >= end) continue;
      if (p.replicated() && layout.tp_rank() != 0) continue;  // tp rank 0 writes it
      if (p.tied_copy) continue;                              // the first pipeline stage writes wte
      const std::string name = state_tensor_name(piece.kind, p.name);
      // The boxes of a flat range are consecutive runs of it, in order.
      int64_t offset = begin - piece.begin;
      for (const TensorBox& box : flat_range_boxes(p.shape, begin - p.offset, end - p.offset)) {
        const std::vector<RunCut> cuts = global_cuts(p, box);
        for (const RunCut& cut : cuts) {
          std::string chunk_key = key;
          int64_t chunk_offset = offset;
          if (cuts.size() > 1 || !(cut.local == box)) {
            // The box's elements, row-major: those of the cut are, per index
            // of the dimensions before split_dim, one run along the rest.
            const auto d = static_cast<size_t>(p.split_dim);
            int64_t outer = 1, inner = 1;
            for (size_t i = 0; i < box.sizes.size(); ++i) {
              if (i < d) outer *= box.sizes[i];
              if (i > d) inner *= box.sizes[i];
            }
            const int64_t from = (cut.local.offsets[d] - box.offsets[d]) * inner;
            const int64_t count = cut.local.sizes[d] * inner;
            const float* src = piece.data + offset;
            if (outer == 1) {
              chunk_offset = offset + from;
            } else {
              if (!repack) return false;
              std::vector<float>& copy = plan.repacked.emplace_back();
              copy.reserve(static_cast<size_t>(outer * count));
              for (int64_t o = 0; o < outer; ++o) {
                const float* row = src + o * box.sizes[d] * inner + from;
                copy.insert(copy.end(), row, row + count);
              }
              chunk_key = fmt::format("{}.{}", key, plan.repacked.size());
              chunk_offset = 0;
              plan.writer.add_f32(chunk_key, {static_cast<int64_t>(copy.size())}, copy.data());
            }
          }
          plan.chunks.push_back({{"name", name},
                                 {"key", chunk_key},
                                 {"offset", chunk_offset},
                                 {"offsets", cut.global.offsets},
                                 {"sizes", cut.global.sizes}});
        }
        offset += box.numel();
      }
    }
  }
  return true;
}

}  // namespace

std::vector<float*> claim_checkpoint_shard(const fs::path& root, int64_t step, int rank,
                                           const ParamLayout& layout,
                                           const std::vector<CheckpointPiece>& pieces,
                                           SpareMappings& mappings) {
  ShardPlan plan;
  if (!plan_shard(layout, pieces, plan, /*repack=*/false)) return {};
  create_checkpoint_directory(root, step);
  const std::vector<char*> data =
      plan.writer.claim(spare_directory(root) / shard_file(rank),
                        partial_directory(root, step) / shard_file(rank), mappings);
  std::vector<float*> out;
  for (char* d : data) out.push_back(reinterpret_cast<float*>(d));
  return out;
}

int64_t write_checkpoint_shard(const fs::path& root, int64_t step, int rank,
                               const ParamLayout& layout,
                               const std::vector<CheckpointPiece>& pieces,
                               const ShardWriting& how) {
  const fs::path partial = partial_directory(root, step);
  ShardPlan plan;
  plan_shard(layout, pieces, plan);
  const fs::path file = partial / shard_file(rank);
  uint64_t hash = 0;
  if (how.prewritten) {
    BRIGADE_CHECK(!how.checksum && plan.repacked.empty());
    if (!fs::exists(file))
      throw_error("the claimed shard {} of step {} is gone", file.string(), step);
  } else {
    SafetensorsWriter::Reuse reuse;
    if (how.recycle) {
      reuse.spare = spare_directory(root) / shard_file(rank);
      reuse.mappings = how.mappings;
    }
    reuse.checksum = how.checksum;
    reuse.read = how.read;
    hash = plan.writer.write(file, reuse);
  }
  const nlohmann::json index = {
      {"file", shard_file(rank)},
      {"bytes", static_cast<int64_t>(fs::file_size(file))},
      {"xxh64", how.checksum ? nlohmann::json(fmt::format("{:016x}", hash)) : nullptr},
      {"chunks", plan.chunks}};
  write_file_atomic(partial / shard_index_file(rank), index.dump());
  return index.at("bytes").get<int64_t>();
}

int missing_checkpoint_shards(const fs::path& root, int64_t step, int num_shards) {
  const fs::path partial = partial_directory(root, step);
  for (int rank = 0; rank < num_shards; ++rank) {
    if (!fs::exists(partial / shard_index_file(rank))) return rank;
  }
  return -1;
}

fs::path commit_checkpoint(const fs::path& root, int64_t step, int num_shards,
                           const GptConfig& config, const CheckpointHeader& header) {
  const fs::path partial = partial_directory(root, step);
  const ParamLayout layout(config);
  // Gather every rank's chunks under their tensors, in layout order.
  std::map<std::string, std::vector<ChunkRecord>> chunks_by_tensor;
  nlohmann::json shards = nlohmann::json::array();
  for (int rank = 0; rank < num_shards; ++rank) {
    const fs::path index_path = partial / shard_index_file(rank);
    if (!fs::exists(index_path)) {
      throw_error("checkpoint {}: rank {} wrote no shard ({} is missing)", partial.string(), rank,
                  index_path.filename().string());
    }
    const nlohmann::json index = nlohmann::json::parse(read_file(index_path));
    shards.push_back(
        {{"file", index.at("file")}, {"bytes", index.at("bytes")}, {"xxh64", index.at("xxh64")}});
    for (const auto& c : index.at("chunks")) {
      ChunkRecord chunk{index.at("file").get<std::string>(), c.at("key").get<std::string>(),
                        c.at("offset").get<int64_t>(),
                        TensorBox{c.at("offsets").get<std::vector<int64_t>>(),
                                  c.at("sizes").get<std::vector<int64_t>>()}};
      chunks_by_tensor[c.at("name").get<std::string>()].push_back(std::move(chunk));
    }
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const StateKind kind : kKinds) {
    for (const ParamInfo& p : layout.params()) {
      const std::string name = state_tensor_name(kind, p.name);
      nlohmann::json chunks = nlohmann::json::array();
      for (const ChunkRecord& c : chunks_by_tensor[name]) {
        chunks.push_back({{"file", c.file},
                          {"key", c.key},
                          {"offset", c.offset},
                          {"offsets", c.box.offsets},
                          {"sizes", c.box.sizes}});
      }
      tensors.push_back({{"name", name}, {"dtype", "F32"}, {"shape", p.shape}, {"chunks", chunks}});
    }
  }
  const nlohmann::json manifest = {{"format", "brigade-checkpoint-1"},
                                   {"step", step},
                                   {"model", config.to_json()},
                                   {"mesh", header.mesh},
                                   {"trainer_state", header.trainer_state},
                                   {"tokenizer", header.tokenizer_spec},
                                   {"tensors", tensors},
                                   {"shards", shards}};
  // The same checks a loader makes: never commit what could not be loaded.
  Manifest::from_json(manifest, (partial / "manifest.json").string());
  write_file_atomic(partial / "manifest.json", Manifest::sealed(manifest).dump(1));
  for (int rank = 0; rank < num_shards; ++rank) fs::remove(partial / shard_index_file(rank));

  // A re-save of a step moves the old copy aside first, so at every moment
  // one complete directory for the step exists.
  const fs::path final_dir = step_directory(root, step);
  const fs::path old_dir = root / fmt::format("{}{:08d}.old", kStepPrefix, step);
  const bool replacing = fs::exists(final_dir);
  if (replacing) {
    fs::remove_all(old_dir);
    fs::rename(final_dir, old_dir);
  }
  fs::rename(partial, final_dir);
  fsync_directory(root);
  if (replacing) fs::remove_all(old_dir);
  return final_dir;
}

fs::path save_checkpoint(const fs::path& root, int64_t step, const GptConfig& config,
                         const float* params, const float* adam_m, const float* adam_v,
                         const CheckpointHeader& header) {
  const int64_t size = ParamLayout(config).size();
  begin_checkpoint(root, step);
  try {
    write_checkpoint_shard(root, step, 0, config,
                           {{StateKind::kParams, 0, size, params},
                            {StateKind::kExpAvg, 0, size, adam_m},
                            {StateKind::kExpAvgSq, 0, size, adam_v}});
    return commit_checkpoint(root, step, 1, config, header);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(partial_directory(root, step), ignored);  // a failed save leaves nothing
    throw;
  }
}

Manifest verify_checkpoint(const fs::path& step_dir, bool snapshot) {
  const Manifest manifest = Manifest::read(step_dir);
  for (const ShardRecord& shard : manifest.shards) {
    const fs::path path = step_dir / shard.file;
    // Name what a bad shard takes with it: the operator's first question.
    auto holds = [&] {
      std::string names;
      int count = 0;
      for (const TensorRecord& t : manifest.tensors) {
        for (const ChunkRecord& c : t.chunks) {
          if (c.file != shard.file) continue;
          if (count++ < 3) names += (names.empty() ? "" : ", ") + t.name;
          break;
        }
      }
      return count > 3 ? fmt::format("{} and {} more", names, count - 3) : names;
    };
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    if (ec)
      throw_error("{}: shard {} is missing (it holds {})", step_dir.string(), shard.file, holds());
    if (static_cast<int64_t>(bytes) != shard.bytes) {
      throw_error("{}: shard {} has {} bytes, the manifest says {} (truncated?); it holds {}",
                  step_dir.string(), shard.file, bytes, shard.bytes, holds());
    }
    if (!shard.xxh64 && !snapshot) {
      throw_error(
          "{}: shard {} has no checksum: this is an in-memory snapshot, which only its agent "
          "resumes from; resume from the run directory instead (when a job fails, its agent "
          "keeps a checked copy of a snapshot newer than every checkpoint there)",
          step_dir.string(), shard.file);
    }
    if (shard.xxh64 && file_xxh64(path) != *shard.xxh64) {
      throw_error("{}: shard {} fails its xxHash64 check (corrupt); it holds {}", step_dir.string(),
                  shard.file, holds());
    }
  }
  return manifest;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  const std::vector<fs::path> dirs = step_dirs(root);
  if (dirs.empty()) return std::nullopt;
  return dirs.back();
}

ResolvedCheckpoint resolve_checkpoint(const fs::path& path, bool snapshot) {
  if (fs::exists(path / "manifest.json")) return {path, verify_checkpoint(path, snapshot)};
  for (const fs::path& root : {path / "checkpoints", path}) {
    const std::vector<fs::path> dirs = step_dirs(root);
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
      try {
        return {*it, verify_checkpoint(*it, snapshot)};
      } catch (const Error& e) {
        std::fprintf(stderr, "brigade: skipping checkpoint %s: %s\n", it->string().c_str(),
                     e.what());
      }
    }
    if (!dirs.empty()) {
      throw_error("cannot resume from {}: none of its {} checkpoints verifies (see above)",
                  path.string(), dirs.size());
    }
  }
  if (!fs::exists(path)) throw_error("cannot resume from {}: no such directory", path.string());
  throw_error(
      "cannot resume from {}: it holds no complete checkpoint (expected manifest.json, or "
      "checkpoints/step_*/manifest.json)",
      path.string());
}

void load_checkpoint_state(const fs::path& step_dir, const Manifest& manifest,
                           const GptConfig& config, StateKind kind, float* out) {
  const GptConfig saved = GptConfig::from_json(manifest.model);
  const auto mismatch = [&](const char* key, int64_t have, int64_t want) {
    if (have != want) {
      throw_error(
          "checkpoint {} was saved with model.{} = {} but the config says {}: set "
          "model.{} = {} to resume it",
          step_dir.string(), key, have, want, key, have);
    }
  };
  mismatch("n_layer", saved.n_layer, config.n_layer);
  mismatch("n_head", saved.n_head, config.n_head);
  mismatch("n_embd", saved.n_embd, config.n_embd);
  mismatch("block_size", saved.block_size, config.block_size);
  mismatch("vocab_size", saved.vocab_size, config.vocab_size);
  const ParamLayout layout(config);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  for (const ParamInfo& p : layout.params()) {
    const std::string name = state_tensor_name(kind, p.name);
    const TensorRecord* tensor = manifest.find(name);
    if (tensor == nullptr) throw_error("checkpoint {} has no tensor {}", step_dir.string(), name);
    if (tensor->shape != p.shape) {
      throw_error("checkpoint {}: {} has shape {}, the model needs {}", step_dir.string(), name,
                  shape_string(tensor->shape), shape_string(p.shape));
    }
    for (const ChunkRecord& chunk : tensor->chunks) {
      auto& file = files[chunk.file];
      if (!file) file = std::make_unique<SafetensorsFile>(step_dir / chunk.file);
      const TensorEntry* entry = file->find(chunk.key);
      if (entry == nullptr || entry->dtype != "F32" || entry->shape.size() != 1 ||
          entry->numel() < chunk.offset + chunk.box.numel()) {
        throw_error("checkpoint {}: {} lacks F32 elements [{}, {}) of {} for {}", step_dir.string(),
                    chunk.file, chunk.offset, chunk.offset + chunk.box.numel(), chunk.key, name);
      }
      scatter_box(static_cast<const float*>(file->data(*entry)) + chunk.offset, chunk.box, p.shape,
                  out + p.offset);
    }
  }
}

void prune_checkpoints(const fs::path& root, int64_t keep, bool recycle) {
  if (keep <= 0) return;
  const std::vector<fs::path> dirs = step_dirs(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i) {
    // Renamed first, in one atomic step: a prune cut short must not leave a
    // manifest whose shards are half deleted.
    fs::path doomed = dirs[i];
    doomed += ".pruned";
    fs::rename(dirs[i], doomed);
    if (recycle) {
      const fs::path spare = spare_directory(root);
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

void release_spares(const fs::path& root) {
  std::error_code ignored;
  fs::remove_all(spare_directory(root), ignored);
}

fs::path copy_checkpoint(const fs::path& step_dir, const fs::path& dst_root) {
  Manifest manifest = verify_checkpoint(step_dir, /*snapshot=*/true);
  const fs::path final_dir = dst_root / step_dir.filename();
  const fs::path copying = partial_directory(dst_root, checkpoint_step(step_dir));
  fs::create_directories(dst_root);
  fs::remove_all(copying);
  try {
    fs::create_directory(copying);
    for (ShardRecord& shard : manifest.shards) {
      fs::copy_file(step_dir / shard.file, copying / shard.file);
      fsync_file(copying / shard.file);  // complete before the manifest says so
      if (!shard.xxh64) shard.xxh64 = file_xxh64(copying / shard.file);
    }
    write_file_atomic(copying / "manifest.json", Manifest::sealed(manifest.to_json()).dump(1));
    verify_checkpoint(copying);
    fs::rename(copying, final_dir);
    fsync_directory(dst_root);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(copying, ignored);
    throw;
  }
  return final_dir;
}

fs::path partial_shard_path(const fs::path& root, int64_t step, int rank) {
  return partial_directory(root, step) / shard_file(rank);
}

void abandon_checkpoint(const fs::path& root, int64_t step) {
  std::error_code ignored;
  fs::remove_all(partial_directory(root, step), ignored);
}

std::vector<fs::path> set_aside_checkpoints_after(const fs::path& root, int64_t step) {
  std::vector<fs::path> newer;
  for (const fs::path& dir : step_dirs(root)) {
    const std::string name = dir.filename().string();
    int64_t saved = 0;
    const char* digits = name.data() + std::strlen(kStepPrefix);
    const auto [end, ec] = std::from_chars(digits, name.data() + name.size(), saved);
    if (ec == std::errc() && end == name.data() + name.size() && saved > step) newer.push_back(dir);
  }
  if (newer.empty()) return {};
  // A second rollback to the same step keeps the first one's branch too.
  const fs::path base = root / "abandoned" / fmt::format("after_step_{:08d}", step);
  fs::path branch = base;
  for (int n = 2; fs::exists(branch); ++n) branch = fmt::format("{}.{}", base.string(), n);
  fs::create_directories(branch);
  std::vector<fs::path> moved;
  for (const fs::path& dir : newer) {
    moved.push_back(branch / dir.filename());
    fs::rename(dir, moved.back());
  }
  fsync_directory(root);
  return moved;
}

}  // namespace brigade

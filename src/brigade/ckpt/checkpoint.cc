#include "brigade/ckpt/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "brigade/ckpt/model_weights.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepPrefix = "step_";

std::vector<fs::path> step_dirs(const fs::path& root) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.starts_with(kStepPrefix) &&
        name.find('.') == std::string::npos && fs::exists(entry.path() / "model.safetensors") &&
        fs::exists(entry.path() / "state.safetensors")) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort by step
  return dirs;
}

}  // namespace

fs::path save_checkpoint(const fs::path& root, int64_t step, const GptConfig& config,
                         const CheckpointView& view) {
  const fs::path final_dir = root / fmt::format("{}{:08d}", kStepPrefix, step);
  const fs::path tmp_dir = root / fmt::format("{}{:08d}.tmp", kStepPrefix, step);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    std::map<std::string, std::string> extra;
    if (!view.tokenizer_spec.empty()) extra["tokenizer"] = view.tokenizer_spec;
    save_model_weights(tmp_dir / "model.safetensors", config, view.params, extra);

    const ParamLayout layout(config);
    SafetensorsWriter state;
    state.set_metadata("trainer_state", view.trainer_state.dump());
    for (const ParamInfo& p : layout.params()) {
      state.add_f32("exp_avg." + p.name, p.shape, view.adam_m + p.offset);
      state.add_f32("exp_avg_sq." + p.name, p.shape, view.adam_v + p.offset);
    }
    state.write(tmp_dir / "state.safetensors");
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);  // a failed save leaves nothing behind
    throw;
  }
  // A re-save of the same step moves the old copy aside first, so at every
  // moment one complete step directory exists.
  const fs::path old_dir = root / fmt::format("{}{:08d}.old", kStepPrefix, step);
  const bool replacing = fs::exists(final_dir);
  if (replacing) {
    fs::remove_all(old_dir);
    fs::rename(final_dir, old_dir);
  }
  fs::rename(tmp_dir, final_dir);
  fsync_directory(root);
  if (replacing) fs::remove_all(old_dir);
  return final_dir;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  const std::vector<fs::path> dirs = step_dirs(root);
  if (dirs.empty()) return std::nullopt;
  return dirs.back();
}

fs::path resolve_checkpoint(const fs::path& path) {
  if (fs::exists(path / "model.safetensors")) return path;
  for (const fs::path& root : {path / "checkpoints", path}) {
    if (auto latest = latest_checkpoint(root)) return *latest;
  }
  if (!fs::exists(path)) throw_error("cannot resume from {}: no such directory", path.string());
  throw_error(
      "cannot resume from {}: it holds no complete checkpoint (expected "
      "model.safetensors, or checkpoints/step_*/ with model and state files)",
      path.string());
}

nlohmann::json load_checkpoint(const fs::path& dir, const GptConfig& config,
                               const CheckpointBuffers& out) {
  const SafetensorsFile weights(dir / "model.safetensors");
  const GptConfig saved = read_weights_config(weights);
  const auto mismatch = [&](const char* key, int64_t have, int64_t want) {
    if (have != want) {
      throw_error(
          "checkpoint {} was saved with model.{} = {} but the config says {}: set "
          "model.{} = {} to resume it",
          dir.string(), key, have, want, key, have);
    }
  };
  mismatch("n_layer", saved.n_layer, config.n_layer);
  mismatch("n_head", saved.n_head, config.n_head);
  mismatch("n_embd", saved.n_embd, config.n_embd);
  mismatch("block_size", saved.block_size, config.block_size);
  mismatch("vocab_size", saved.vocab_size, config.vocab_size);
  const ParamLayout layout(config);
  load_model_weights(weights, layout, out.params);

  const SafetensorsFile state(dir / "state.safetensors");
  for (const ParamInfo& p : layout.params()) {
    state.read_f32("exp_avg." + p.name, p.shape, out.adam_m + p.offset);
    state.read_f32("exp_avg_sq." + p.name, p.shape, out.adam_v + p.offset);
  }
  const auto it = state.metadata().find("trainer_state");
  if (it == state.metadata().end()) {
    throw_error("{}: state.safetensors has no trainer_state metadata", dir.string());
  }
  nlohmann::json trainer_state = nlohmann::json::parse(it->second, nullptr, false);
  if (trainer_state.is_discarded() || !trainer_state.is_object()) {
    throw_error("{}: trainer_state in state.safetensors is not a JSON object", dir.string());
  }
  return trainer_state;
}

void prune_checkpoints(const fs::path& root, int64_t keep) {
  if (keep <= 0) return;
  const std::vector<fs::path> dirs = step_dirs(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i) fs::remove_all(dirs[i]);
}

}  // namespace brigade

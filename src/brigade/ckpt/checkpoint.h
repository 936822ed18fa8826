// A single-process training checkpoint: one directory per step,
//   <root>/step_00000100/model.safetensors   weights (see model_weights.h)
//   <root>/step_00000100/state.safetensors   AdamW moments by parameter name
//                                            ("exp_avg.<name>", "exp_avg_sq.<name>")
//                                            and the trainer state as JSON
//                                            metadata ("trainer_state")
// The directory is assembled under a temporary name and renamed into place,
// so a step directory either exists whole or not at all.
// (The distributed, resharding form extends this; see issue "Distributed
// checkpoints".)
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"

namespace brigade {

struct CheckpointView {
  const float* params = nullptr;  // flat buffers of ParamLayout(config).size()
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
  nlohmann::json trainer_state;  // step, optimizer step, sampler and schedule
  std::string tokenizer_spec;    // recorded in the weights so `brigade sample` can decode
};

// Writes <root>/step_<step>; returns its path.
std::filesystem::path save_checkpoint(const std::filesystem::path& root, int64_t step,
                                      const GptConfig& config, const CheckpointView& view);

// `path` is a checkpoint directory (holds model.safetensors) or a run/root
// directory (its newest complete step_* checkpoint, looking in checkpoints/).
// Error if none is found.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

// The newest complete checkpoint under root, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

struct CheckpointBuffers {
  float* params = nullptr;
  float* adam_m = nullptr;
  float* adam_v = nullptr;
};

// Loads a checkpoint saved for `config`; a shape mismatch is an Error naming
// the tensor, both shapes and the config key to change. Returns trainer_state.
nlohmann::json load_checkpoint(const std::filesystem::path& dir, const GptConfig& config,
                               const CheckpointBuffers& out);

// Deletes all but the newest `keep` step directories under root (keep <= 0: none).
void prune_checkpoints(const std::filesystem::path& root, int64_t keep);

}  // namespace brigade

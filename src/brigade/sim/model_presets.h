// Named model shapes for `brigade plan --model NAME`: GPT-2 small and the
// GPT-3-style family of Megatron-LM's scaling studies (sequence 2048,
// vocabulary 51200), each with the global batch those studies used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "brigade/model/gpt_config.h"
#include "brigade/sim/layout.h"

namespace brigade::sim {

struct ModelPreset {
  std::string name;  // "175b"
  GptConfig model;
  int64_t seq_len = 2048;
  int64_t global_batch = 512;  // sequences
};

std::optional<ModelPreset> find_model_preset(const std::string& name);
// The preset's job (shape, sequence, batch) with the default SystemFeatures;
// throws Error naming the presets when `name` is none of them.
Workload preset_workload(const std::string& name);
const std::vector<ModelPreset>& model_presets();

}  // namespace brigade::sim

#include "brigade/sim/model_presets.h"

#include "brigade/core/error.h"

namespace brigade::sim {
namespace {

ModelPreset gpt(const char* name, int64_t layers, int64_t heads, int64_t hidden,
                int64_t global_batch) {
  ModelPreset p;
  p.name = name;
  p.model.n_layer = layers;
  p.model.n_head = heads;
  p.model.n_embd = hidden;
  p.model.vocab_size = 51200;
  p.model.block_size = 2048;
  p.global_batch = global_batch;
  return p;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  // Shapes and batches from Narayanan et al. 2021 (Table 1) and Korthikanti
  // et al. 2022 (Table 3); 175b is GPT-3's shape with its 1536-sequence batch.
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> p;
    ModelPreset small = gpt("gpt2-small", 12, 12, 768, 512);
    small.model.vocab_size = 50257;
    small.model.block_size = 1024;
    small.seq_len = 1024;
    p.push_back(small);
    p.push_back(gpt("1.7b", 24, 24, 2304, 512));
    p.push_back(gpt("3.6b", 30, 32, 3072, 512));
    p.push_back(gpt("7.5b", 36, 32, 4096, 512));
    p.push_back(gpt("18.4b", 40, 48, 6144, 1024));
    p.push_back(gpt("22b", 48, 64, 6144, 4));
    p.push_back(gpt("39.1b", 48, 64, 8192, 1536));
    p.push_back(gpt("76.1b", 60, 80, 10240, 1792));
    p.push_back(gpt("145.6b", 80, 96, 12288, 2304));
    p.push_back(gpt("175b", 96, 96, 12288, 1536));
    p.push_back(gpt("310.1b", 96, 128, 16384, 2160));
    p.push_back(gpt("530b", 105, 128, 20480, 2520));
    p.push_back(gpt("1t", 128, 160, 25600, 3072));
    return p;
  }();
  return presets;
}

std::optional<ModelPreset> find_model_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

Workload preset_workload(const std::string& name) {
  const std::optional<ModelPreset> preset = find_model_preset(name);
  if (!preset) {
    std::string names;
    for (const ModelPreset& p : model_presets()) names += " " + p.name;
    throw_error("no model preset \"{}\" (presets:{})", name, names);
  }
  Workload job;
  job.model = preset->model;
  job.seq_len = preset->seq_len;
  job.global_batch = preset->global_batch;
  return job;
}

}  // namespace brigade::sim

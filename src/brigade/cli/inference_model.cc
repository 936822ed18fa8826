#include "brigade/cli/inference_model.h"

#include <filesystem>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/model_weights.h"
#include "brigade/core/error.h"

namespace brigade::cli {
namespace fs = std::filesystem;

InferenceModel load_inference_model(const std::string& path) {
  fs::path weights = path;
  if (!fs::exists(weights)) throw_error("--ckpt {}: no such file or directory", path);
  if (fs::is_directory(weights)) {
    // A training checkpoint: the parameters, from whichever shards hold them.
    const auto [dir, manifest] = resolve_checkpoint(weights);
    const GptConfig config = GptConfig::from_json(manifest.model);
    InferenceModel m;
    m.weights_path = dir.string();
    m.params = FloatBuffer(ParamLayout(config).size());
    load_checkpoint_state(dir, manifest, config, StateKind::kParams, m.params.data());
    m.model = std::make_unique<Gpt>(config, m.params.data(), nullptr);
    m.tokenizer_spec = manifest.tokenizer;
    return m;
  }
  const SafetensorsFile file(weights);
  const GptConfig config = read_weights_config(file);
  InferenceModel m;
  m.weights_path = weights.string();
  const ParamLayout layout(config);
  m.params = FloatBuffer(layout.size());
  load_model_weights(file, layout, m.params.data());
  m.model = std::make_unique<Gpt>(config, m.params.data(), nullptr);
  if (auto it = file.metadata().find("tokenizer"); it != file.metadata().end()) {
    m.tokenizer_spec = it->second;
  }
  return m;
}

}  // namespace brigade::cli

#include "brigade/ckpt/model_weights.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"

namespace brigade {

void save_model_weights(const std::filesystem::path& path, const GptConfig& config,
                        const float* params,
                        const std::map<std::string, std::string>& extra_metadata) {
  const ParamLayout layout(config);
  SafetensorsWriter writer;
  for (const auto& [key, value] : extra_metadata) writer.set_metadata(key, value);
  writer.set_metadata("format", "pt");
  writer.set_metadata("config", config.to_json().dump());
  for (const ParamInfo& p : layout.params()) writer.add_f32(p.name, p.shape, params + p.offset);
  writer.write(path);
}

GptConfig read_weights_config(const SafetensorsFile& file) {
  const auto& meta = file.metadata();
  if (auto it = meta.find("config"); it != meta.end()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
      throw_error("{}: metadata 'config' is not valid JSON: {}", file.path().string(), e.what());
    }
    return GptConfig::from_json(j);
  }
  const std::filesystem::path hf_config = file.path().parent_path() / "config.json";
  std::ifstream in(hf_config);
  if (!in) {
    throw_error(
        "{} does not say which model it holds: it has no 'config' metadata and there is "
        "no config.json beside it; put the model's Hugging Face config.json next to it",
        file.path().string());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    GptConfig c;
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.block_size = j.contains("n_positions") ? j.at("n_positions").get<int64_t>()
                                             : j.at("n_ctx").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is not a usable GPT-2 config: {}", hf_config.string(), e.what());
  }
}

void load_model_weights(const SafetensorsFile& file, const ParamLayout& layout, float* params) {
  for (const ParamInfo& p : layout.params()) {
    std::string name = p.name;
    if (file.find(name) == nullptr && file.find("transformer." + name) != nullptr) {
      name = "transformer." + name;
    }
    if (file.find(name) == nullptr) {
      throw_error("{} has no tensor {}: it does not hold a GPT-2 model of this shape",
                  file.path().string(), p.name);
    }
    file.read_f32(name, p.shape, params + p.offset);
  }
}

}  // namespace brigade

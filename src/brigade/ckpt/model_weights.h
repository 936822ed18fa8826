// Model weights as one safetensors file in Hugging Face GPT-2's names and
// layouts, with our model config in the metadata under "config". Files made
// by other tools load too: a "transformer." name prefix is accepted, GPT-2's
// non-parameter buffers (attn.bias, attn.masked_bias) and the tied
// lm_head.weight are ignored, F16/BF16 are widened, and when the metadata has
// no config, a Hugging Face config.json beside the file supplies it.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "brigade/ckpt/safetensors.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"

namespace brigade {

// extra_metadata adds keys beside "config" (the trainer records "tokenizer").
void save_model_weights(const std::filesystem::path& path, const GptConfig& config,
                        const float* params,
                        const std::map<std::string, std::string>& extra_metadata = {});

// The config a weights file was saved with (metadata, else config.json
// beside it); Error if neither says.
GptConfig read_weights_config(const SafetensorsFile& file);

// Fills params (layout.size() floats) from the file; every parameter must be
// present with the layout's shape (Error naming the tensor otherwise).
void load_model_weights(const SafetensorsFile& file, const ParamLayout& layout, float* params);

}  // namespace brigade

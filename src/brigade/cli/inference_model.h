// A model loaded for inference from whatever the user points at: a weights
// .safetensors file (ours or another tool's), a checkpoint directory, or a
// run directory (its newest checkpoint).
#pragma once

#include <memory>
#include <string>

#include "brigade/core/aligned_buffer.h"
#include "brigade/model/gpt.h"

namespace brigade::cli {

struct InferenceModel {
  FloatBuffer params;
  std::unique_ptr<Gpt> model;
  std::string tokenizer_spec;  // from the weights' metadata; empty if unknown
  std::string weights_path;
};

InferenceModel load_inference_model(const std::string& path);

}  // namespace brigade::cli

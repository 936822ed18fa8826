// brigade_reftool: the C++ side of tests/reference/check_against_torch.py.
//
//   brigade_reftool grads WEIGHTS TOKENS OUT --batch B --seq T
//     OUT.safetensors: "loss" (1), "logits" (B,T,V), "grad.<name>" per parameter
//   brigade_reftool steps WEIGHTS TOKENS OUT --batch B --seq T --steps N --lr X
//       --weight-decay X --beta1 X --beta2 X --eps X --grad-clip X
//     OUT.json: {"losses": [...]}: the loss before each of N AdamW steps on
//     the same batch, with constant LR
//
// TOKENS is raw little-endian int32 of shape (B, T+1): inputs [:, :T],
// targets [:, 1:]. It goes through the same model, clipping and optimizer
// code as `brigade train`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "brigade/ckpt/model_weights.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/threads.h"
#include "brigade/model/gpt.h"
#include "brigade/optim/adamw.h"
#include "brigade/optim/grad_clip.h"
#include "brigade/train/trainer.h"

namespace {
using namespace brigade;

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch read_tokens(const std::string& path, int64_t b, int64_t t) {
  const std::string bytes = read_file(path);
  if (static_cast<int64_t>(bytes.size()) != b * (t + 1) * 4) {
    throw_error("{} holds {} bytes, expected B*(T+1)*4 = {}", path, bytes.size(), b * (t + 1) * 4);
  }
  const auto* all = reinterpret_cast<const int32_t*>(bytes.data());
  Batch batch;
  for (int64_t row = 0; row < b; ++row) {
    const int32_t* r = all + row * (t + 1);
    batch.inputs.insert(batch.inputs.end(), r, r + t);
    batch.targets.insert(batch.targets.end(), r + 1, r + t + 1);
  }
  return batch;
}

struct Loaded {
  GptConfig config;
  FloatBuffer params, grads;
};

Loaded load(const std::string& path) {
  const SafetensorsFile file(path);
  Loaded m{read_weights_config(file), {}, {}};
  const ParamLayout layout(m.config);
  m.params = FloatBuffer(layout.size());
  m.grads = FloatBuffer(layout.size());
  load_model_weights(file, layout, m.params.data());
  return m;
}

void run_grads(const std::string& weights, const std::string& tokens, const std::string& out,
               int64_t b, int64_t t) {
  Loaded m = load(weights);
  const Batch batch = read_tokens(tokens, b, t);
  Gpt model(m.config, m.params.data(), m.grads.data());
  const float loss = model.forward_backward(batch.inputs.data(), batch.targets.data(), b, t,
                                            1.0f / static_cast<float>(b * t));
  std::vector<float> logits(static_cast<size_t>(b * t * m.config.vocab_size));
  model.forward_logits(batch.inputs.data(), b, t, logits.data());
  SafetensorsWriter w;
  w.add_f32("loss", {1}, &loss);
  w.add_f32("logits", {b, t, m.config.vocab_size}, logits.data());
  for (const ParamInfo& p : model.layout().params()) {
    w.add_f32("grad." + p.name, p.shape, m.grads.data() + p.offset);
  }
  w.write(out);
}

struct StepArgs {
  int64_t steps = 10;
  double lr = 1e-3, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 0.0;
};

void run_steps(const std::string& weights, const std::string& tokens, const std::string& out,
               int64_t b, int64_t t, const StepArgs& a) {
  Loaded m = load(weights);
  const Batch batch = read_tokens(tokens, b, t);
  Gpt model(m.config, m.params.data(), m.grads.data());
  AdamWConfig ac;
  ac.beta1 = a.beta1;
  ac.beta2 = a.beta2;
  ac.eps = a.eps;
  ac.weight_decay = a.weight_decay;
  AdamW opt(ac, decay_ranges(model.layout(), false), model.layout().size());
  nlohmann::json losses = nlohmann::json::array();
  for (int64_t s = 0; s < a.steps; ++s) {
    m.grads.zero();
    const float loss = model.forward_backward(batch.inputs.data(), batch.targets.data(), b, t,
                                              1.0f / static_cast<float>(b * t));
    losses.push_back(loss);
    const double norm = grad_norm(m.grads.data(), m.grads.size());
    opt.step(m.params.data(), m.grads.data(), a.lr, clip_scale(norm, a.grad_clip));
  }
  write_file_atomic(out, nlohmann::json{{"losses", losses}}.dump() + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Brigade reference tool (tests only)"};
  app.require_subcommand(1);
  std::string weights, tokens, out;
  int64_t b = 0, t = 0;
  StepArgs step_args;
  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("weights", weights)->required();
    cmd->add_option("tokens", tokens)->required();
    cmd->add_option("out", out)->required();
    cmd->add_option("--batch", b)->required();
    cmd->add_option("--seq", t)->required();
  };
  auto* grads = app.add_subcommand("grads");
  add_common(grads);
  auto* steps = app.add_subcommand("steps");
  add_common(steps);
  steps->add_option("--steps", step_args.steps);
  steps->add_option("--lr", step_args.lr);
  steps->add_option("--weight-decay", step_args.weight_decay);
  steps->add_option("--beta1", step_args.beta1);
  steps->add_option("--beta2", step_args.beta2);
  steps->add_option("--eps", step_args.eps);
  steps->add_option("--grad-clip", step_args.grad_clip);
  CLI11_PARSE(app, argc, argv);
  try {
    brigade::set_num_threads(2);
    if (*grads) run_grads(weights, tokens, out, b, t);
    if (*steps) run_steps(weights, tokens, out, b, t, step_args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade_reftool: %s\n", e.what());
    return 1;
  }
  return 0;
}

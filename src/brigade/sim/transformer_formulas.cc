#include "brigade/sim/transformer_formulas.h"

#include <algorithm>

namespace brigade::sim {

double block_params(double h) {
  return 12.0 * h * h + 13.0 * h;
}

double model_params(const GptConfig& model, int64_t seq_len) {
  const double h = static_cast<double>(model.n_embd);
  return static_cast<double>(model.vocab_size) * h + static_cast<double>(seq_len) * h +
         static_cast<double>(model.n_layer) * block_params(h) + 2.0 * h;
}

double stage_params_per_gpu(const GptConfig& model, int64_t seq_len, const Layout& layout,
                            bool first_stage, bool last_stage) {
  const double h = static_cast<double>(model.n_embd);
  const double t = static_cast<double>(layout.tp);
  // Column-parallel QKV and fc1 split weights and biases; row-parallel proj and
  // fc2 split weights, keep biases whole; LayerNorms are whole.
  const double block = (12.0 * h * h + 7.0 * h) / t + 6.0 * h;
  const double layers = static_cast<double>(model.n_layer) / static_cast<double>(layout.pp);
  double params = layers * block;
  const double embedding = static_cast<double>(model.vocab_size) * h / t;
  if (first_stage) params += embedding + static_cast<double>(seq_len) * h;
  if (last_stage) params += 2.0 * h + (first_stage ? 0.0 : embedding);
  return params;
}

double model_flops_per_step(const GptConfig& model, int64_t seq_len, int64_t global_batch) {
  const double L = static_cast<double>(model.n_layer), h = static_cast<double>(model.n_embd);
  const double s = static_cast<double>(seq_len), V = static_cast<double>(model.vocab_size);
  const double B = static_cast<double>(global_batch);
  return 72.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * L * h));
}

double hardware_flops_per_step(const GptConfig& model, int64_t seq_len, int64_t global_batch,
                               PlanRecompute recompute) {
  const double L = static_cast<double>(model.n_layer), h = static_cast<double>(model.n_embd);
  const double s = static_cast<double>(seq_len), V = static_cast<double>(model.vocab_size);
  const double B = static_cast<double>(global_batch);
  switch (recompute) {
    case PlanRecompute::kNone:
      return model_flops_per_step(model, seq_len, global_batch);
    case PlanRecompute::kSelective:
      return model_flops_per_step(model, seq_len, global_batch) + 4.0 * B * s * s * h * L;
    case PlanRecompute::kFull:
      return 96.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h));
  }
  return 0;
}

double block_activation_bytes(const GptConfig& model, int64_t seq_len, const Layout& layout,
                              const SystemFeatures& features) {
  const double h = static_cast<double>(model.n_embd), a = static_cast<double>(model.n_head);
  const double s = static_cast<double>(seq_len), b = static_cast<double>(layout.micro);
  const double t = static_cast<double>(layout.tp);
  const double sbh = s * b * h;
  const double scale = features.act_bytes / 2.0;
  if (layout.recompute == PlanRecompute::kFull) {
    return scale * 2.0 * sbh / (layout.sp ? t : 1.0);
  }
  double score_term = 0;  // coefficient of a s / (h t)
  if (!features.flash_attention && layout.recompute == PlanRecompute::kNone) {
    score_term = features.attention_dropout ? 5.0 : 2.0;
  }
  const double linear = layout.sp ? 34.0 / t : 10.0 + 24.0 / t;
  return scale * sbh * (linear + score_term * a * s / (h * t));
}

double split_backward_kept_bytes(const GptConfig& model, int64_t seq_len, const Layout& layout,
                                 const SystemFeatures& features) {
  const double h = static_cast<double>(model.n_embd), t = static_cast<double>(layout.tp);
  const double rows = static_cast<double>(seq_len) * static_cast<double>(layout.micro);
  return features.act_bytes * rows * (2.0 * h + 7.0 * h / t);
}

double inflight_microbatches(const Layout& layout, int64_t num_microbatches) {
  const double p = static_cast<double>(layout.pp), v = static_cast<double>(layout.vp);
  double inflight = p;
  if (layout.vp > 1) inflight *= 1.0 + (p - 1.0) / (p * v);
  return std::min(inflight, static_cast<double>(num_microbatches));
}

double bubble_fraction(int64_t pp, int64_t vp, int64_t num_microbatches) {
  const double idle = static_cast<double>(pp - 1) / static_cast<double>(vp);
  return idle / (static_cast<double>(num_microbatches) + idle);
}

StateBytes zero_state_bytes(double params, int zero, int64_t dp, const SystemFeatures& features) {
  const double d = static_cast<double>(dp);
  StateBytes bytes;
  bytes.params = params * features.param_bytes / (zero >= 3 ? d : 1.0);
  bytes.grads = params * features.grad_bytes / (zero >= 2 ? d : 1.0);
  bytes.optimizer = params * features.optimizer_bytes / (zero >= 1 ? d : 1.0);
  return bytes;
}

}  // namespace brigade::sim

#include "brigade/model/gpt_chunks.h"

#include "brigade/core/error.h"

namespace brigade {

GptChunks::GptChunks(const GptConfig& config, float* params, float* grads, TensorParallel* tp,
                     const std::vector<LayerRange>& chunks)
    : config_(config),
      layout_(config, tp != nullptr ? tp->rank() : 0, tp != nullptr ? tp->size() : 1, chunks) {
  for (size_t c = 0; c < layout_.parts().size(); ++c) {
    const int64_t offset = layout_.part_offset(c);
    chunks_.push_back(std::make_unique<Gpt>(config, params + offset,
                                            grads != nullptr ? grads + offset : nullptr, tp,
                                            layout_.parts()[c]));
  }
}

GptChunks::~GptChunks() = default;

void GptChunks::set_grad_ready_hook(int64_t c, const Gpt::GradReadyHook& hook) {
  if (!hook) {
    chunk(c).set_grad_ready_hook(nullptr);
    return;
  }
  chunk(c).set_grad_ready_hook([hook, offset = layout_.part_offset(static_cast<size_t>(c))](
                                   int64_t ready_from) { hook(offset + ready_from); });
}

void GptChunks::set_param_residency(ParamResidency* residency) {
  BRIGADE_CHECK(residency == nullptr || size() == 1,
                "parameter residency (ZeRO 3) runs with one model chunk, not {}", size());
  for (auto& c : chunks_) c->set_param_residency(residency);
}

void GptChunks::set_sequence_parallel(bool on) {
  for (auto& c : chunks_) c->set_sequence_parallel(on);
}

void GptChunks::init_weights(uint64_t seed, float* params) const {
  for (size_t c = 0; c < chunks_.size(); ++c) {
    init_gpt2_weights(chunks_[c]->layout(), config_.n_layer, seed, params + layout_.part_offset(c));
  }
}

int64_t GptChunks::activation_bytes(int64_t b, int64_t t) const {
  int64_t bytes = 0;
  for (const auto& c : chunks_) bytes += c->activation_bytes(b, t);
  return bytes;
}

}  // namespace brigade

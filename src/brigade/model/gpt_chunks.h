// The model chunks one pipeline stage holds (Megatron's interleaved
// schedule: v chunks of blocks per stage, chunk c of stage s the
// (c*p + s)-th of the p*v block ranges), each a Gpt part over its own run of
// one flat buffer. With one chunk it is a plain Gpt part, so the trainer
// and the pipeline executor hold every layout as chunks.
//
// The buffer is laid out by one ParamLayout of several parts (param_layout.h):
// chunk c's tensors at layout().part_offset(c) on, in its own part's order.
// Checkpoints and the optimizer see that one layout; each chunk's Gpt sees
// only its run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "brigade/model/gpt.h"

namespace brigade {

class GptChunks {
 public:
  // As Gpt's constructor, with one layer range per chunk, ascending.
  GptChunks(const GptConfig& config, float* params, float* grads, TensorParallel* tp,
            const std::vector<LayerRange>& chunks);
  ~GptChunks();

  const GptConfig& config() const { return config_; }
  // Every chunk's tensors, in one buffer.
  const ParamLayout& layout() const { return layout_; }
  int64_t size() const { return static_cast<int64_t>(chunks_.size()); }
  Gpt& chunk(int64_t c) { return *chunks_[static_cast<size_t>(c)]; }

  // Chunk c's grad-ready hook, its offsets moved to the whole buffer's
  // (Gpt::set_grad_ready_hook; an empty hook turns it off).
  void set_grad_ready_hook(int64_t c, const Gpt::GradReadyHook& hook);
  // ZeRO 3's residency speaks in the buffer's offsets: one chunk only.
  void set_param_residency(ParamResidency* residency);
  void set_sequence_parallel(bool on);

  // init_gpt2_weights for every chunk (each draws as its part of the whole
  // model) into `params`, the buffer given to the constructor.
  void init_weights(uint64_t seed, float* params) const;

  // Bytes of activation memory one (B,T) micro-batch needs in each chunk, summed.
  int64_t activation_bytes(int64_t b, int64_t t) const;

 private:
  GptConfig config_;
  ParamLayout layout_;
  std::vector<std::unique_ptr<Gpt>> chunks_;
};

}  // namespace brigade

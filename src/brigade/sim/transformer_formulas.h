// Closed-form counts for a GPT-2-architecture transformer: parameters, FLOPs,
// activation memory, ZeRO memory and pipeline bubble. Pure functions of the
// shapes, so each can be checked against numbers worked by hand.
//
// Symbols (as in Narayanan et al. 2021 and Korthikanti et al. 2022):
//   L layers, h hidden size, a attention heads, s sequence length,
//   V vocabulary, b micro-batch, B global batch (sequences), t tensor-parallel
//   size, p pipeline stages, v virtual stages per pipeline rank, m micro-batches
//   per pipeline per step, d data-parallel size.
#pragma once

#include <cstdint>

#include "brigade/model/gpt_config.h"
#include "brigade/sim/layout.h"

namespace brigade::sim {

// Parameters of one block: QKV, projection and the two MLP matrices (12h^2),
// their biases (9h) and two LayerNorms (4h).
double block_params(double h);
// Whole model: token embedding (tied LM head) V*h, positions s*h, L blocks,
// final LayerNorm 2h. Equals GptConfig::num_params() when block_size == s.
double model_params(const GptConfig& model, int64_t seq_len);
// Parameters one GPU of a pipeline stage holds: its blocks' tensor-parallel
// shard (LayerNorms and the row-parallel biases stay whole) plus, on the
// first stage, the vocabulary-parallel embedding and the positions, and on
// the last, the LM head's copy of the embedding (when p > 1) and ln_f.
double stage_params_per_gpu(const GptConfig& model, int64_t seq_len, const Layout& layout,
                            bool first_stage, bool last_stage);

// Model FLOPs of one step (forward + backward, no recompute):
// 72 B s L h^2 (1 + s/(6h) + V/(12 L h)). The basis of MFU.
double model_flops_per_step(const GptConfig& model, int64_t seq_len, int64_t global_batch);
// FLOPs the hardware actually runs, counting recompute the way Megatron-LM's
// papers report TFLOP/s: full recompute adds one forward of every block,
// 96 B s L h^2 (1 + s/(6h) + V/(16 L h)); selective adds the attention
// score and value products again, 4 B s^2 h L.
double hardware_flops_per_step(const GptConfig& model, int64_t seq_len, int64_t global_batch,
                               PlanRecompute recompute);

// Bytes of activations one block keeps for backward, per micro-batch, on one
// GPU (Korthikanti et al. 2022, section 4, with 2-byte activations and 1-byte
// dropout masks; scaled by act_bytes / 2 otherwise):
//   no recompute, no SP:   s b h (10 + 24/t + 5 a s/(h t))
//   no recompute, SP:      s b h (34/t + 5 a s/(h t))
//   selective:             the a s^2 term is gone
//   full:                  2 s b h (the block's input; / t with SP)
// Fused (flash) attention keeps no a s^2 term; without attention dropout the
// unfused term is 2 a s/(h t) (softmax output only) instead of 5.
double block_activation_bytes(const GptConfig& model, int64_t seq_len, const Layout& layout,
                              const SystemFeatures& features);

// What a split backward (ZB-H1) keeps of one block for one micro-batch from
// its input half to its weight half: the linear layers' output gradients,
// which the deferred weight gradients read, act_bytes s b (2h + 7h/t) (the
// two projections' outputs whole, c_fc's 4h and c_attn's 3h columns split
// over tp), the same with or without sequence parallelism (a weight
// gradient reads all rows).
double split_backward_kept_bytes(const GptConfig& model, int64_t seq_len, const Layout& layout,
                                 const SystemFeatures& features);

// Megatron's closed forms for 1F1B and interleaved 1F1B with equal stages.
// The cost model takes both from the simulated schedule instead
// (pipeline.h), which also covers GPipe, ZB-H1 and unequal stages; the tests
// hold the simulation to these where they apply.
//
// Micro-batches whose activations the first pipeline stage holds at the peak
// of 1F1B: p of them, times (1 + (p-1)/(p v)) when interleaved, never more
// than m.
double inflight_microbatches(const Layout& layout, int64_t num_microbatches);

// Share of the pipeline's time spent idle in fill and drain:
// (p-1)/v / (m + (p-1)/v).
double bubble_fraction(int64_t pp, int64_t vp, int64_t num_microbatches);

// Bytes per GPU for weights, gradients and optimizer state of `params`
// parameters under ZeRO stage `zero` over `dp` ranks (Rajbhandari et al.
// 2020): stage 1 divides the optimizer state by d, stage 2 the gradients too,
// stage 3 the weights too.
struct StateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
StateBytes zero_state_bytes(double params, int zero, int64_t dp, const SystemFeatures& features);

}  // namespace brigade::sim

// The LM head fused with softmax cross-entropy, in row chunks, so the (N,V)
// logits never exist all at once: with V = 50257 and N = 4096 they would be
// 823 MB, more than the rest of GPT-2 small's activations together.
//
// Per chunk of rows:  logits (rows,V) = x (rows,C) @ wte^T (C,V)
//   loss_i = logsumexp(logits_i) - logits_i[target_i]
// and, when gradients are wanted, straight away:
//   dlogits = (softmax(logits) - onehot(target)) * loss_scale
//   dx (rows,C) = dlogits @ wte;   dwte (V,C) += dlogits^T @ x
//
// Vocabulary-parallel (Megatron-LM's parallel cross-entropy): wte may be
// this rank's rows [vocab_begin, vocab_begin + v) of the whole embedding,
// the last of them padding. Each chunk's logits are then this rank's
// columns only; per row the kernel takes the max, the sum of exp(logit -
// max) and the target's logit over its real columns, and `combine` turns
// them into the whole vocabulary's (over the tp group) before the loss and
// dlogits are formed. dx is then this rank's share of the input gradient,
// to be summed over the group; dwte is exactly this rank's rows' gradient.
#pragma once

#include <cstdint>
#include <functional>

namespace brigade::cpu {

struct LmHeadLossArgs {
  const float* x = nullptr;          // (N,C) final LayerNorm output
  const float* wte = nullptr;        // (V,C) token embedding, tied LM head
  const int32_t* targets = nullptr;  // (N) next-token ids (global)
  int64_t n = 0, c = 0, v = 0;
  float* losses = nullptr;  // (N) per-row loss, out
  // Gradients: both null for evaluation. loss_scale is d(total loss)/d(row
  // loss), 1/(rows in the global batch) for a mean.
  float* dx = nullptr;    // (N,C), overwritten
  float* dwte = nullptr;  // (V,C), accumulated
  float loss_scale = 0.0f;
  // lm_head_scratch_floats(n, v) floats for one chunk of logits; null to
  // allocate per call.
  float* scratch = nullptr;
  // Rows per chunk; 0 for the default (128 MiB of logits). Tests set it
  // small so that chunk boundaries are crossed; it must not exceed the
  // default when `scratch` is given.
  int64_t chunk_rows = 0;
  // Vocabulary-parallel: wte's row j is token vocab_begin + j; rows
  // [v_real, v) are padding: their logits are left out of the softmax and
  // their dwte rows get nothing (a rank may hold only padding: v_real 0).
  // v_real < 0 means v.
  int64_t vocab_begin = 0;
  int64_t v_real = -1;
  // Called once per chunk, on every tp rank alike, with (rows,3) floats per
  // row: (max, sum of exp(logit - max), target logit) over this rank's
  // columns (-inf, 0, 0 for a rank with none; target logit 0 when the
  // target is not here). It must leave the same over the whole vocabulary.
  // Empty: wte is the whole vocabulary.
  std::function<void(float* stats, int64_t rows)> combine = {};
  // (Last, so that positional initialisers keep their meaning.)
  // ZB-H1's weight half (Qi et al. 2024) takes the head's dwte product out
  // of this pass: with dx set and dwte null, dlogits (N,V) is written here
  // instead, for lm_head_weight_grad later (the kernel's chunks are then
  // rows of it, so no chunk scratch is used).
  float* dlogits = nullptr;
};

int64_t lm_head_scratch_floats(int64_t n, int64_t v);

void lm_head_loss(const LmHeadLossArgs& args);

// The dwte that lm_head_loss would have added when it wrote `dlogits`
// instead: dwte (V,C) += dlogits^T @ x, in the same row chunks (chunk_rows
// as given to it), so the sum is bit for bit the fused kernel's.
void lm_head_weight_grad(float* dwte, const float* dlogits, const float* x, int64_t n, int64_t c,
                         int64_t v, int64_t chunk_rows = 0);

// logits (N,V) = x (N,C) @ wte^T, for sampling and tests.
void lm_head_logits(float* logits, const float* x, const float* wte, int64_t n, int64_t c,
                    int64_t v);

}  // namespace brigade::cpu

// The LM head fused with softmax cross-entropy, in row chunks, so the (N,V)
// logits never exist all at once: with V = 50257 and N = 4096 they would be
// 823 MB, more than the rest of GPT-2 small's activations together.
//
// Per chunk of rows:  logits (rows,V) = x (rows,C) @ wte^T (C,V)
//   loss_i = logsumexp(logits_i) - logits_i[target_i]
// and, when gradients are wanted, straight away:
//   dlogits = (softmax(logits) - onehot(target)) * loss_scale
//   dx (rows,C) = dlogits @ wte;   dwte (V,C) += dlogits^T @ x
#pragma once

#include <cstdint>

namespace brigade::cpu {

struct LmHeadLossArgs {
  const float* x = nullptr;          // (N,C) final LayerNorm output
  const float* wte = nullptr;        // (V,C) token embedding, tied LM head
  const int32_t* targets = nullptr;  // (N) next-token ids
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
};

int64_t lm_head_scratch_floats(int64_t n, int64_t v);

void lm_head_loss(const LmHeadLossArgs& args);

// logits (N,V) = x (N,C) @ wte^T, for sampling and tests.
void lm_head_logits(float* logits, const float* x, const float* wte, int64_t n, int64_t c,
                    int64_t v);

}  // namespace brigade::cpu

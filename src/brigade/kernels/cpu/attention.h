// Causal multi-head self-attention over a packed qkv tensor, with memory
// linear in T: the (T,T) score matrix is never stored. The forward pass keeps
// only the output and each query row's log-sum-exp; the backward pass
// recomputes one block of query rows' scores at a time from q, k and lse
// (the FlashAttention recipe, laid out for CPU caches and GEMM calls).
//
// Shapes (hd = C / H, scale = 1/sqrt(hd)):
//   qkv (B,T,3C): [q | k | v] along the last dim, head h at columns h*hd..
//   out (B,T,C):  heads concatenated, y_t = sum_{s<=t} softmax_s(q_t.k_s*scale) v_s
//   lse (B,H,T):  log sum_{s<=t} exp(q_t.k_s*scale)
#pragma once

#include <cstdint>

namespace brigade::cpu {

// Working memory for up to `num_threads` threads (floats); callers that run
// often pass it in as `scratch` so no call allocates. scratch may be null.
int64_t attention_scratch_floats(int64_t t, int num_threads);

void attention_forward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t c,
                       int64_t num_heads, float* scratch = nullptr);

// Inverts attention_forward, given dout (B,T,C). dqkv (B,T,3C) is overwritten.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t b, int64_t t, int64_t c, int64_t num_heads,
                        float* scratch = nullptr);

}  // namespace brigade::cpu

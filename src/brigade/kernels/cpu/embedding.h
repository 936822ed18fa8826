// Token + position embedding.
//   out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
#pragma once

#include <cstdint>

namespace brigade::cpu {

// out (B,T,C); tokens (B,T); wte (V,C); wpe (block_size,C), T <= block_size.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t b, int64_t t, int64_t c);

// dwte (V,C) += scatter of dout rows by token; dwpe (T,C) += sum over batch.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t b, int64_t t, int64_t c);

}  // namespace brigade::cpu

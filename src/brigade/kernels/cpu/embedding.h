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

// Vocabulary-parallel pieces (the tp ranks each hold rows [vocab_begin,
// vocab_begin + vocab_rows) of wte; summed over the ranks, the token parts
// make the whole lookup, and the position part is added once, afterwards).
// out (N,C) = wte[tokens[i] - vocab_begin] for a token held here, else 0.
void token_embedding_forward(float* out, const int32_t* tokens, const float* wte,
                             int64_t vocab_begin, int64_t vocab_rows, int64_t n, int64_t c);
// dwte (vocab_rows,C) += dout rows of the tokens held here.
void token_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                              int64_t vocab_begin, int64_t vocab_rows, int64_t n, int64_t c);
// Rows [row0, row0 + n) of a (B,T,C) tensor, at positions (row0 + i) % t:
// out (n,C) += wpe at each row's position.
void position_embedding_add(float* out, const float* wpe, int64_t row0, int64_t n, int64_t t,
                            int64_t c);
// dwpe (T,C) += the sum over the batch of dout (B,T,C).
void position_embedding_backward(float* dwpe, const float* dout, int64_t b, int64_t t, int64_t c);

}  // namespace brigade::cpu

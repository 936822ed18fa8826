#include "brigade/kernels/cpu/embedding.h"

#include <algorithm>

#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

// The vocabulary-parallel pieces: plain loops, built once (not per ISA);
// they move N*C floats against the blocks' GEMMs.
#if !defined(BRIGADE_KERNELS_AVX512)
namespace brigade::cpu {

void token_embedding_forward(float* out, const int32_t* tokens, const float* wte,
                             int64_t vocab_begin, int64_t vocab_rows, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(n * c))
  for (int64_t row = 0; row < n; ++row) {
    const int64_t j = static_cast<int64_t>(tokens[row]) - vocab_begin;
    float* o = out + row * c;
    if (j < 0 || j >= vocab_rows) {
      std::fill(o, o + c, 0.0f);
      continue;
    }
    std::copy(wte + j * c, wte + (j + 1) * c, o);
  }
}

void token_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                              int64_t vocab_begin, int64_t vocab_rows, int64_t n, int64_t c) {
  // Rows of one token collide, so threads split the columns (as embedding_backward).
  constexpr int64_t kColumnBlock = 32;
  const int64_t num_blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (worth_threading(n * c))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
    for (int64_t row = 0; row < n; ++row) {
      const int64_t j = static_cast<int64_t>(tokens[row]) - vocab_begin;
      if (j < 0 || j >= vocab_rows) continue;
      const float* g = dout + row * c;
      float* te = dwte + j * c;
      for (int64_t i = c0; i < c1; ++i) te[i] += g[i];
    }
  }
}

void position_embedding_add(float* out, const float* wpe, int64_t row0, int64_t n, int64_t t,
                            int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(n * c))
  for (int64_t row = 0; row < n; ++row) {
    const float* pe = wpe + ((row0 + row) % t) * c;
    float* o = out + row * c;
    for (int64_t i = 0; i < c; ++i) o[i] += pe[i];
  }
}

void position_embedding_backward(float* dwpe, const float* dout, int64_t b, int64_t t, int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(t * c))
  for (int64_t pos = 0; pos < t; ++pos) {
    float* pe = dwpe + pos * c;
    for (int64_t row = 0; row < b; ++row) {
      const float* g = dout + (row * t + pos) * c;
      for (int64_t i = 0; i < c; ++i) pe[i] += g[i];
    }
  }
}

}  // namespace brigade::cpu
#endif

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t b, int64_t t, int64_t c) {
#pragma omp parallel for schedule(static) if (worth_threading(b * t * c))
  for (int64_t row = 0; row < b * t; ++row) {
    const float* te = wte + static_cast<int64_t>(tokens[row]) * c;
    const float* pe = wpe + (row % t) * c;
    float* o = out + row * c;
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) o[i] = te[i] + pe[i];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t b, int64_t t, int64_t c) {
  // The same token can appear in many rows, so rows cannot be split between
  // threads; columns can: each thread owns a slice of every embedding row.
  constexpr int64_t kColumnBlock = 32;
  const int64_t num_blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (worth_threading(b * t * c))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
    for (int64_t row = 0; row < b * t; ++row) {
      const float* g = dout + row * c;
      float* te = dwte + static_cast<int64_t>(tokens[row]) * c;
      float* pe = dwpe + (row % t) * c;
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) {
        te[i] += g[i];
        pe[i] += g[i];
      }
    }
  }
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

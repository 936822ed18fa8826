#include "brigade/kernels/cpu/vector_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "brigade/core/stream_store.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

double sum_squares(const float* x, int64_t n) {
  // Fixed blocks summed in a fixed order, not an OpenMP reduction (which
  // combines per-thread sums in whatever order threads finish): the gradient
  // norm, and so the clipping factor, must not change from run to run, or
  // resume would not be bit-identical.
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(num_blocks), 0.0);
#pragma omp parallel for schedule(static) if (worth_threading(n))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t end = std::min(n, (blk + 1) * kBlock);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = blk * kBlock; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[blk] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

namespace {

constexpr uint32_t kPlaceKey = 0x9E3779B1u;
constexpr uint32_t kSecondFactor = 0x5BD1E995u;

// Element i's three terms (its place: 3 (first + i) mod 2^32).
inline uint64_t state_hash_terms(const float* const (&state)[3], int64_t i, uint32_t place) {
  uint64_t sum = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    uint32_t bits = 0;
    std::memcpy(&bits, state[k] + i, sizeof(bits));
    const uint32_t a = kPlaceKey * (place + k) ^ bits;
    sum += static_cast<uint64_t>(a) * (a ^ kSecondFactor);
  }
  return sum;
}

// state_hash of one block, on the calling thread. Eight elements at a
// time: the keys step by 8 * 3 * kPlaceKey, and vpmuludq multiplies the
// even 32-bit lanes' zero-extended values into 64 bits (the odd lanes
// shifted down for a second one). AVX2 at both levels: sixteen lanes ran
// no faster on Zen 4 (43.9 against 49 ms for GPT-2 small's state).
inline uint64_t state_hash_block(const float* p, const float* m, const float* v, int64_t n,
                                 int64_t first) {
  const auto place = static_cast<uint32_t>(3 * first);
  const float* const state[3] = {p, m, v};
  int64_t i = 0;
  uint64_t sum = 0;
#if defined(__x86_64__)
  const __m256i second = _mm256_set1_epi32(static_cast<int>(kSecondFactor));
  const auto lane_key = [&](uint32_t lane, uint32_t k) {
    return static_cast<int>(kPlaceKey * (place + 3 * lane + k));
  };
  const auto keys_of = [&](uint32_t k) {
    return _mm256_setr_epi32(lane_key(0, k), lane_key(1, k), lane_key(2, k), lane_key(3, k),
                             lane_key(4, k), lane_key(5, k), lane_key(6, k), lane_key(7, k));
  };
  __m256i keys[3] = {keys_of(0), keys_of(1), keys_of(2)};
  const __m256i advance = _mm256_set1_epi32(static_cast<int>(kPlaceKey * 24u));
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 3; ++k) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state[k] + i));
      const __m256i a = _mm256_xor_si256(x, keys[k]);
      const __m256i b = _mm256_xor_si256(a, second);
      even = _mm256_add_epi64(even, _mm256_mul_epu32(a, b));
      odd = _mm256_add_epi64(odd,
                             _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32)));
      keys[k] = _mm256_add_epi32(keys[k], advance);
    }
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(even, odd));
  sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
  for (; i < n; ++i) {
    sum += state_hash_terms(state, i, place + 3 * static_cast<uint32_t>(i));
  }
  return sum;
}

}  // namespace

uint64_t state_hash(const float* p, const float* m, const float* v, int64_t n, int64_t first) {
  // Integer sums: exact in any order, so one reduction over the threads.
  constexpr int64_t kBlock = 2048;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (worth_threading(n))
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t begin = blk * kBlock;
    const int64_t end = std::min(n, begin + kBlock);
    sum += state_hash_block(p + begin, m + begin, v + begin, end - begin, first + begin);
  }
  return sum;
}

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWStep& s, const AdamWCopy& copy, uint64_t* hash, int64_t first) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), s.step));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), s.step));
  const float step_size = s.lr / bias1;
  const float bias2_sqrt = std::sqrt(bias2);
  const float decay = 1.0f - s.lr * s.weight_decay;
  // Blocks of 2048 elements (8 KB of each array): a block's new values are
  // copied out while they are still in L1. One loop body whether or not a
  // copy is asked for, so the two round identically.
  constexpr int64_t kBlock = 2048;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  const bool copying = copy.params != nullptr || copy.m != nullptr || copy.v != nullptr;
  uint64_t hashed = 0;
#pragma omp parallel if (worth_threading(n))
  {
#pragma omp for schedule(static) reduction(+ : hashed)
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      const int64_t begin = blk * kBlock;
      const int64_t end = std::min(n, begin + kBlock);
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) {
        const float g = grads[i] * s.grad_scale;
        const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
        const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = std::sqrt(vi) / bias2_sqrt + s.eps;
        params[i] = params[i] * decay - step_size * mi / denom;
      }
      if (copying) {
        const auto bytes = static_cast<size_t>(end - begin) * sizeof(float);
        if (copy.params) copy_nontemporal(copy.params + begin, params + begin, bytes);
        if (copy.m) copy_nontemporal(copy.m + begin, m + begin, bytes);
        if (copy.v) copy_nontemporal(copy.v + begin, v + begin, bytes);
      }
      if (hash != nullptr) {
        hashed +=
            state_hash_block(params + begin, m + begin, v + begin, end - begin, first + begin);
      }
    }
    // Each thread's streaming stores, before the team joins.
    if (copying) store_fence();
  }
  if (hash != nullptr) *hash += hashed;
}

const char* kernels_compiled_for() {
#if defined(BRIGADE_KERNELS_AVX512)
  // An AVX-512 intrinsic compiles only where isa_variant.h's target pragma
  // is in force (GCC's C++ front end does not define __AVX512F__ for it).
  float in[16], out[16];
  for (int i = 0; i < 16; ++i) in[i] = static_cast<float>(i);
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(in), _mm512_loadu_ps(in)));
  return out[15] == 30.0f ? "avx512" : "not avx512";
#else
  return "avx2";
#endif
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

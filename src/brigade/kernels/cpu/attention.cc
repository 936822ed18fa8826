#include "brigade/kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "brigade/kernels/cpu/fast_exp.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

namespace brigade::cpu {
namespace {

// Query rows per block: big enough that the GEMMs are efficient, small
// enough that a (block, T) tile of scores stays in L2 for T up to ~2k.
constexpr int64_t kQueryBlock = 64;

// Parallel work is one (batch, head) pair: it owns its slice of every output,
// so dK and dV accumulate without atomics.
struct HeadView {
  const float* q;
  const float* k;
  const float* v;
  int64_t ld;  // row stride of q, k, v inside qkv: 3C
};

HeadView head_view(const float* qkv, int64_t bi, int64_t h, int64_t t, int64_t c, int64_t hd) {
  const float* base = qkv + bi * t * 3 * c + h * hd;
  return {base, base + c, base + 2 * c, 3 * c};
}

// Per-thread working memory: a (block, T) tile of scores, one of their
// gradients, and the block's D_i.
int64_t per_thread_floats(int64_t t) {
  return 2 * kQueryBlock * t + kQueryBlock;
}

// Thread `thread`'s slice of scratch, or of `owned` when the caller gave none.
float* thread_scratch(float* scratch, std::vector<float>& owned, int64_t t) {
  if (scratch != nullptr) return scratch + omp_get_thread_num() * per_thread_floats(t);
  owned.resize(static_cast<size_t>(per_thread_floats(t)));
  return owned.data();
}

}  // namespace

#if !defined(BRIGADE_KERNELS_AVX512)
int64_t attention_scratch_floats(int64_t t, int num_threads) {
  return per_thread_floats(t) * num_threads;
}
#endif

}  // namespace brigade::cpu

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

void attention_forward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t c,
                       int64_t num_heads, float* scratch) {
  const int64_t hd = c / num_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (worth_threading(b * t * t * c))
  {
    std::vector<float> owned;
    float* scores = thread_scratch(scratch, owned, t);
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < b * num_heads; ++pair) {
      const int64_t bi = pair / num_heads, h = pair % num_heads;
      const HeadView hv = head_view(qkv, bi, h, t, c, hd);
      float* o = out + bi * t * c + h * hd;
      float* l = lse + pair * t;
      for (int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, t - i0);
        const int64_t keys = i0 + rows;  // causal: rows see keys [0, i0+rows)
        // S (rows, keys) = scale * Q[i0:i0+rows] K[0:keys]^T
        gemm(false, true, rows, keys, hd, scale, hv.q + i0 * hv.ld, hv.ld, hv.k, hv.ld, 0.0f,
             scores, keys);
        for (int64_t r = 0; r < rows; ++r) {
          float* s = scores + r * keys;
          const int64_t visible = i0 + r + 1;
          float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, s[j]);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < visible; ++j) {
            s[j] = fast_exp(s[j] - mx);
            sum += s[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
          for (int64_t j = visible; j < keys; ++j) s[j] = 0.0f;
          l[i0 + r] = mx + std::log(sum);
        }
        // O[i0:i0+rows] (rows, hd) = P (rows, keys) V[0:keys] (keys, hd)
        gemm(false, false, rows, hd, keys, 1.0f, scores, keys, hv.v, hv.ld, 0.0f, o + i0 * c, c);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t b, int64_t t, int64_t c, int64_t num_heads,
                        float* scratch) {
  const int64_t hd = c / num_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (worth_threading(b * t * t * c))
  {
    std::vector<float> owned;
    float* p = thread_scratch(scratch, owned, t);
    float* dp = p + kQueryBlock * t;
    float* delta = dp + kQueryBlock * t;
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < b * num_heads; ++pair) {
      const int64_t bi = pair / num_heads, h = pair % num_heads;
      const HeadView hv = head_view(qkv, bi, h, t, c, hd);
      const float* o = out + bi * t * c + h * hd;
      const float* dout_h = dout + bi * t * c + h * hd;
      const float* l = lse + pair * t;
      float* dq = dqkv + bi * t * 3 * c + h * hd;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      for (int64_t s = 0; s < t; ++s) {
        std::fill(dk + s * 3 * c, dk + s * 3 * c + hd, 0.0f);
        std::fill(dv + s * 3 * c, dv + s * 3 * c + hd, 0.0f);
      }
      for (int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, t - i0);
        const int64_t keys = i0 + rows;
        // Recompute P = exp(scale * Q K^T - lse), masked.
        gemm(false, true, rows, keys, hd, scale, hv.q + i0 * hv.ld, hv.ld, hv.k, hv.ld, 0.0f, p,
             keys);
        // dP (rows, keys) = dO (rows, hd) V^T (hd, keys)
        gemm(false, true, rows, keys, hd, 1.0f, dout_h + i0 * c, c, hv.v, hv.ld, 0.0f, dp, keys);
        for (int64_t r = 0; r < rows; ++r) {
          const float* orow = o + (i0 + r) * c;
          const float* grow = dout_h + (i0 + r) * c;
          float d = 0.0f;  // D_i = sum_d dO_i,d O_i,d  (= sum_j P_ij dP_ij)
#pragma omp simd reduction(+ : d)
          for (int64_t e = 0; e < hd; ++e) d += orow[e] * grow[e];
          delta[r] = d;
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p + r * keys;
          float* dpr = dp + r * keys;
          const int64_t visible = i0 + r + 1;
          const float lr = l[i0 + r], dr = delta[r];
          // dS = P * (dP - D); the scale of S is folded into the GEMMs below.
#pragma omp simd
          for (int64_t j = 0; j < visible; ++j) {
            pr[j] = fast_exp(pr[j] - lr);
            dpr[j] = pr[j] * (dpr[j] - dr);
          }
          for (int64_t j = visible; j < keys; ++j) pr[j] = dpr[j] = 0.0f;
        }
        // dQ (rows, hd) = scale * dS K
        gemm(false, false, rows, hd, keys, scale, dp, keys, hv.k, hv.ld, 0.0f, dq + i0 * 3 * c,
             3 * c);
        // dK (keys, hd) += scale * dS^T Q
        gemm(true, false, keys, hd, rows, scale, dp, keys, hv.q + i0 * hv.ld, hv.ld, 1.0f, dk,
             3 * c);
        // dV (keys, hd) += P^T dO
        gemm(true, false, keys, hd, rows, 1.0f, p, keys, dout_h + i0 * c, c, 1.0f, dv, 3 * c);
      }
    }
  }
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

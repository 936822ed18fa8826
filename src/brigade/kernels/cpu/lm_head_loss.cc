#include "brigade/kernels/cpu/lm_head_loss.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/kernels/cpu/fast_exp.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa_variant.h"
#include "brigade/kernels/cpu/parallel.h"

namespace brigade::cpu {
namespace {
// 128 MiB of logits per chunk (667 rows of GPT-2's 50257). Each chunk's GEMMs
// repack the whole (V,C) embedding and read and write all of dwte, so fewer,
// larger chunks win; measured on GPT-2 small's 1024 rows (kernels_bench
// lm_head_loss_with_grads): 64-row chunks made the step 15% slower than 32
// MiB ones, and 32 MiB ones take 1.33-1.38 s against 1.20 s for these. One
// chunk for all 1024 rows is only 3% faster still, and would hold every
// logit at once; the memory bound matters more at long sequences.
constexpr int64_t kChunkFloats = int64_t{32} << 20;

// The most rows one chunk may hold: what the scratch is sized for. At least
// 64 rows, so the dwte GEMM has a reasonable inner dimension.
int64_t most_chunk_rows(int64_t n, int64_t v) {
  return std::min(n, std::max<int64_t>(64, kChunkFloats / v));
}

// The rows split into equal chunks of at most most_chunk_rows: GPT-2's 1024
// rows as 512 + 512 rather than 667 + 357, whose short chunk's GEMMs run
// less efficiently. Never above most_chunk_rows(m, v) for any m >= n, so a
// scratch sized for the largest n serves every smaller one.
int64_t chunk_rows(int64_t n, int64_t v) {
  const int64_t most = most_chunk_rows(n, v);
  const int64_t chunks = (n + most - 1) / most;
  return (n + chunks - 1) / chunks;
}

// The rows of one chunk: `requested` (tests), or chunk_rows's.
int64_t rows_per_chunk(int64_t n, int64_t v, int64_t requested) {
  return requested > 0 ? std::min(n, requested) : chunk_rows(n, v);
}
}  // namespace

#if !defined(BRIGADE_KERNELS_AVX512)
int64_t lm_head_scratch_floats(int64_t n, int64_t v) {
  return most_chunk_rows(n, v) * v;
}

void lm_head_logits(float* logits, const float* x, const float* wte, int64_t n, int64_t c,
                    int64_t v) {
  gemm(false, true, n, v, c, 1.0f, x, c, wte, c, 0.0f, logits, v);
}

void lm_head_weight_grad(float* dwte, const float* dlogits, const float* x, int64_t n, int64_t c,
                         int64_t v, int64_t chunk_rows) {
  const int64_t chunk = rows_per_chunk(n, v, chunk_rows);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    gemm(true, false, v, c, rows, 1.0f, dlogits + r0 * v, v, x + r0 * c, c, 1.0f, dwte, c);
  }
}
#endif

}  // namespace brigade::cpu

BRIGADE_ISA_NAMESPACE(brigade::cpu) {

void lm_head_loss(const LmHeadLossArgs& a) {
  const bool want_grads = a.dx != nullptr;
  BRIGADE_CHECK(want_grads == ((a.dwte != nullptr) != (a.dlogits != nullptr)),
                "dx goes with one of dwte and dlogits");
  const int64_t v_real = a.v_real >= 0 ? a.v_real : a.v;
  BRIGADE_CHECK(v_real <= a.v, "lm_head_loss: v_real {} exceeds v {}", v_real, a.v);
  const int64_t chunk = rows_per_chunk(a.n, a.v, a.chunk_rows);
  BRIGADE_CHECK(a.scratch == nullptr || a.dlogits != nullptr || chunk <= most_chunk_rows(a.n, a.v),
                "lm_head_loss: chunk_rows {} is larger than the scratch holds", a.chunk_rows);
  std::unique_ptr<float[]> owned;
  float* logits = a.scratch;
  if (logits == nullptr && a.dlogits == nullptr) {
    owned.reset(new float[static_cast<size_t>(chunk * a.v)]);
    logits = owned.get();
  }
  // The target's column here, or -1 when another rank holds it.
  const auto local_target = [&](int64_t row) -> int64_t {
    const int64_t j = static_cast<int64_t>(a.targets[row]) - a.vocab_begin;
    return j >= 0 && j < v_real ? j : -1;
  };
  // Row r's (max, sum of exp(logit - max)) over the real columns here.
  const auto row_stats = [&](const float* lr, float& mx, float& sum) {
    mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < v_real; ++j) mx = std::max(mx, lr[j]);
    sum = 0.0f;
    if (v_real == 0) return;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v_real; ++j) sum += fast_exp(lr[j] - mx);
  };
  // The loss, and dlogits in place of the logits, given the row's lse and
  // target logit over the whole vocabulary.
  const auto finish_row = [&](float* lr, int64_t row, float lse, float target_logit) {
    a.losses[row] = lse - target_logit;
    if (!want_grads) return;
    const float s = a.loss_scale;
#pragma omp simd
    for (int64_t j = 0; j < v_real; ++j) lr[j] = fast_exp(lr[j] - lse) * s;
    std::fill(lr + v_real, lr + a.v, 0.0f);  // padding: no gradient
    const int64_t target = local_target(row);
    if (target >= 0) lr[target] -= s;
  };
  std::vector<float> stats;
  for (int64_t r0 = 0; r0 < a.n; r0 += chunk) {
    const int64_t rows = std::min(chunk, a.n - r0);
    const float* xc = a.x + r0 * a.c;
    // Deferred dwte: this chunk's rows of dlogits, kept for the weight half.
    if (a.dlogits != nullptr) logits = a.dlogits + r0 * a.v;
    lm_head_logits(logits, xc, a.wte, rows, a.c, a.v);
    if (!a.combine) {
      // The whole vocabulary is here: one pass per row while it is in cache.
      // With gradients, each exp is computed once: exp(logit - max) stays in
      // the row and is scaled by loss_scale / sum (what finish_row would
      // recompute as exp(logit - lse) * loss_scale, one exp per logit more).
#pragma omp parallel for schedule(static) if (worth_threading(rows * a.v))
      for (int64_t r = 0; r < rows; ++r) {
        float* lr = logits + r * a.v;
        const int64_t row = r0 + r;
        const int64_t target = local_target(row);
        const float target_logit = lr[target];
        if (!want_grads) {
          float mx, sum;
          row_stats(lr, mx, sum);
          a.losses[row] = mx + std::log(sum) - target_logit;
          continue;
        }
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < v_real; ++j) mx = std::max(mx, lr[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < v_real; ++j) {
          lr[j] = fast_exp(lr[j] - mx);
          sum += lr[j];
        }
        a.losses[row] = mx + std::log(sum) - target_logit;
        const float factor = a.loss_scale / sum;
#pragma omp simd
        for (int64_t j = 0; j < v_real; ++j) lr[j] *= factor;
        std::fill(lr + v_real, lr + a.v, 0.0f);  // padding: no gradient
        if (target >= 0) lr[target] -= a.loss_scale;
      }
    } else {
      stats.resize(static_cast<size_t>(3 * rows));
#pragma omp parallel for schedule(static) if (worth_threading(rows * a.v))
      for (int64_t r = 0; r < rows; ++r) {
        float* st = stats.data() + 3 * r;
        row_stats(logits + r * a.v, st[0], st[1]);
        const int64_t target = local_target(r0 + r);
        st[2] = target >= 0 ? logits[r * a.v + target] : 0.0f;
      }
      a.combine(stats.data(), rows);
#pragma omp parallel for schedule(static) if (worth_threading(rows * a.v))
      for (int64_t r = 0; r < rows; ++r) {
        const float* st = stats.data() + 3 * r;
        finish_row(logits + r * a.v, r0 + r, st[0] + std::log(st[1]), st[2]);
      }
    }
    if (!want_grads) continue;
    // dx (rows,C) = dlogits (rows,V) @ wte (V,C)
    gemm(false, false, rows, a.c, a.v, 1.0f, logits, a.v, a.wte, a.c, 0.0f, a.dx + r0 * a.c, a.c);
    // dwte (V,C) += dlogits^T (V,rows) @ x (rows,C)
    if (a.dwte == nullptr) continue;  // lm_head_weight_grad's, later
    gemm(true, false, a.v, a.c, rows, 1.0f, logits, a.v, xc, a.c, 1.0f, a.dwte, a.c);
  }
}

}  // BRIGADE_ISA_NAMESPACE(brigade::cpu)

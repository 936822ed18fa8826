// Elementwise operations over flat float arrays, threaded.
#pragma once

#include <cstdint>

namespace brigade::cpu {

// sum_i x[i]^2, accumulated in double: gradients of 10^8 elements would lose
// digits in a float sum.
double sum_squares(const float* x, int64_t n);

// AdamW on one contiguous range (Loshchilov & Hutter, decoupled decay),
// with g = grads * grad_scale:
//   p -= lr * wd * p
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
// The arithmetic order follows torch.optim.AdamW so the two agree to rounding.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
  float grad_scale = 1.0f;
};
// Where the updated values also go, element for element (each may be
// null): an in-memory snapshot's file, written by the update that computes
// them instead of by a copy that reads them again (optim/adamw.h). Streaming
// stores, fenced before the call returns.
struct AdamWCopy {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};
// With `hash` (non-null), adds to *hash the state_hash of the updated
// values (first: the flat offset of params[0]), taken from L1 block by
// block as they are computed: how the replica check gets its hash of the
// state without a pass of its own over it (parallel/replica_check.h).
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWStep& s, const AdamWCopy& copy, uint64_t* hash = nullptr,
                  int64_t first = 0);

// A 64-bit hash of the parameters p and Adam moments m and v of the flat
// elements [first, first + n), for replicas to compare bit for bit:
//   sum over i in [0, n) and k in {p, m, v} of (x ^ a) * (x ^ a ^ D)  mod 2^64
// with x the 32 bits of k[i], a = 0x9E3779B1 * (3 (first + i) + k's index)
// mod 2^32 (the element's place, so moved values count) and D = 0x5BD1E995.
// Each term is a product of two 32-bit factors, so a flipped bit in one
// value always changes it (D has more than one bit set: the two factors
// cannot trade the flip's 2^b between them) and so the sum; several
// changes cancel by chance only. A sum, so a range hashed in pieces, in
// any order, on any threads, adds up to the same value: the update adds
// its blocks wherever its runs are cut. Threaded.
uint64_t state_hash(const float* p, const float* m, const float* v, int64_t n, int64_t first);

}  // namespace brigade::cpu

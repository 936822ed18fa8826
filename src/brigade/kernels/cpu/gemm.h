// Single-precision GEMM, the one entry point every kernel uses.
//
//   C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C     (row-major)
//
// A is stored (m, k) with row stride lda, or (k, m) when trans_a; B is
// stored (k, n) with row stride ldb, or (n, k) when trans_b.
//
// The backend is oneDNN's sgemm: it generates its kernels at run time for
// the instruction set CPUID reports (AVX-512, AVX2), so it runs near the
// FMA peak on any x86-64 CPU, named or not. OpenBLAS picks its kernels by
// CPU model and falls back to generic SSE3 code when a VM hides the model
// (a quarter of the speed on an AVX-512 Xeon; docs/PERFORMANCE.md, "GEMM
// backends", has the measurements that chose oneDNN). One exception: at
// the AVX2 level oneDNN 2.6 runs A^T B (the weight gradients) with outputs
// of a few hundred per side at 50-60% of its own rate for other products,
// while OpenBLAS's Haswell kernels, with the core named for them, run them
// near the peak (docs/PERFORMANCE.md, "Weight gradients at the AVX2
// level"); those go to OpenBLAS when its OpenMP build is installed.
// Threads: OpenMP's current team size; called inside a parallel region, it
// runs on the calling thread.
#pragma once

#include <cstdint>
#include <string>

namespace brigade::cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// "oneDNN 2.6.3, avx512_core" (the library and the ISA it generates code
// for), and at the AVX2 level which library runs the weight gradients.
std::string gemm_backend();
// Which code the GEMMs run, and so their reduction order: oneDNN's
// effective ISA (a dnnl_cpu_isa_t), with bit 32 set when OpenBLAS runs the
// weight gradients. Ranks that recompute each other's gradients bit for
// bit must agree on it (train/silent_corruption.h).
int64_t gemm_isa();

}  // namespace brigade::cpu

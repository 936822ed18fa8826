// Compiles a kernel file for one instruction-set level. The kernel sources
// (kernels/cpu/*.cc, listed in src/CMakeLists.txt) are compiled twice: as
// part of the library, for the baseline (x86-64-v3: AVX2 + FMA), and once
// more with BRIGADE_KERNELS_AVX512 for AVX-512. Each build puts its
// functions in its own namespace (brigade::cpu::avx2, brigade::cpu::avx512);
// kernels/cpu/dispatch.cc defines the public functions, which call one or
// the other by active_isa().
//
// Include this header LAST in a kernel file, then write the kernels inside
// `namespace brigade::cpu::BRIGADE_ISA { ... }`. The target pragma applies
// only to what follows it: inline functions and templates from the headers
// above (the standard library's, fmt's) stay baseline code, so the linker can
// never keep an AVX-512 copy of a shared inline function and run it on a CPU
// without AVX-512. Helpers of a kernel belong inside the namespace, after
// this include (an anonymous namespace inside it keeps them private).
#pragma once

#if defined(BRIGADE_KERNELS_AVX512)
#define BRIGADE_ISA avx512
// x86-64-v4, and 512-bit vectors for the loops GCC vectorises (its generic
// tuning would otherwise often stop at 256 bits).
#pragma GCC target("avx512f,avx512cd,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#else
#define BRIGADE_ISA avx2
#endif

// Compiles a kernel file for one instruction-set level. The kernel sources
// (kernels/cpu/*.cc, listed in src/CMakeLists.txt) are compiled twice: as
// part of the library, for the baseline (x86-64-v3: AVX2 + FMA), and once
// more with BRIGADE_KERNELS_AVX512 for AVX-512. Each build puts its kernels
// in its own namespace (brigade::cpu::avx2, brigade::cpu::avx512);
// kernels/cpu/dispatch.cc defines the public functions, which call one or
// the other by active_isa().
//
// A kernel file writes its kernels, and any helpers that should be built per
// level, inside
//
//   BRIGADE_ISA_NAMESPACE(brigade::cpu) {
//   ...
//   }  // BRIGADE_ISA_NAMESPACE(brigade::cpu)
//
// after all of its includes. In the AVX-512 build the macro also switches
// the compiler's target from that point on. Inline functions and templates
// from the headers above it (the standard library's, fmt's, ours) stay
// baseline code, so the linker can never keep an AVX-512 copy of a shared
// inline function and run it on a CPU without AVX-512. (GCC's C++ front end
// does not define __AVX512F__ after the pragma: test BRIGADE_KERNELS_AVX512.)
#pragma once

#if defined(BRIGADE_KERNELS_AVX512)
// x86-64-v4, and 512-bit vectors for the loops GCC vectorises (its generic
// tuning would otherwise often stop at 256 bits).
// _Pragma takes one string literal: clang-format must not split it.
// clang-format off
#define BRIGADE_ISA_NAMESPACE(outer) \
  _Pragma("GCC target(\"avx512f,avx512cd,avx512bw,avx512dq,avx512vl,prefer-vector-width=512\")") \
  namespace outer::avx512
// clang-format on
#else
#define BRIGADE_ISA_NAMESPACE(outer) namespace outer::avx2
#endif

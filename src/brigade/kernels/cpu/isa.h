// What the CPU can do, read from CPUID, and which instruction-set level
// Brigade's kernels run at.
//
// Brigade is built for x86-64-v3 (AVX2 + FMA, every x86 CPU since 2013-2015)
// and carries a second, AVX-512 build of its hot kernels (kernels/cpu/*.cc,
// compiled twice; see isa_variant.h). The level is chosen once per process
// from the CPU's feature bits, never from its model name (cloud VMs often
// hide it, and a name table is always out of date). Tests and benchmarks
// force the lower level with BRIGADE_CPU_ISA=avx2 to run the AVX2 path on
// an AVX-512 machine; the GEMM backend (oneDNN) is held to the same level.
#pragma once

#include <string>

namespace brigade::cpu {

enum class Isa { kAvx2, kAvx512 };

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // the model name as CPUID reports it (may be generic)
  int family = 0;      // display family and model (CPUID leaf 1)
  int model = 0;
  bool avx2 = false;  // with FMA and the OS saving the YMM registers
  bool fma = false;
  // AVX-512 F, CD, BW, DQ and VL (x86-64-v4), with the OS saving the ZMM and
  // mask registers: what the AVX-512 kernels are compiled for.
  bool avx512 = false;
  bool avx512_bf16 = false;
  bool amx = false;  // AMX tiles (BF16/INT8): noted for the log, not used
};

// This CPU's features (CPUID, read once).
const CpuFeatures& cpu_features();

// The highest level this CPU supports.
Isa best_isa(const CpuFeatures& features);

// The level for a CPU with `features` when the user asked for `requested`
// (BRIGADE_CPU_ISA's value: "avx2", "avx512", or null/empty for the best).
// Throws Error naming the fix if `requested` is unknown or beyond the CPU,
// and if the CPU lacks AVX2/FMA (Brigade's baseline).
Isa choose_isa(const CpuFeatures& features, const char* requested);

// The level the kernels and the GEMMs run at: choose_isa(cpu_features(),
// $BRIGADE_CPU_ISA), fixed at the first call.
Isa active_isa();

// "avx2" / "avx512".
const char* isa_name(Isa isa);

// The level of the kernel build the dispatcher calls ("avx512" only from
// code that uses an AVX-512 instruction): tests check that forcing a level
// reaches the kernels, and that the AVX-512 build really is one.
const char* kernels_compiled_for();

// One line for logs: "AVX-512 (avx512f+bw+dq+vl, bf16) on GenuineIntel
// 'Intel(R) Xeon(R) Processor' family 6 model 207", with "(forced by
// BRIGADE_CPU_ISA)" when forced.
std::string describe_cpu();

}  // namespace brigade::cpu

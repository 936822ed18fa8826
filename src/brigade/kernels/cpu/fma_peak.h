// This machine's fp32 peak: the denominator of MFU on a CPU.
//
// A CPU's peak is cores x FMA units x vector lanes x 2 FLOPs x clock. The
// lanes come from CPUID (16 fp32 lanes where AVX-512 is present, else 8);
// the clock and the number of FMA units per core are measured, because a VM
// hides the model number and the clock it really runs at (turbo, the
// all-core clock, a host that shares the core between two vCPUs). An sgemm
// measurement is no substitute: a GEMM library that misdetects the CPU runs
// at a quarter of the peak, and MFU against that reads above 100%.
#pragma once

#include <string>

namespace brigade::cpu {

struct FmaPeak {
  int threads = 0;       // threads measured at once (the caller's thread count)
  int fma_units = 0;     // FMA instructions each thread retires per cycle
  int lanes = 0;         // fp32 lanes of the widest vector: 16 (AVX-512) or 8
  double clock_ghz = 0;  // mean over the threads, with all of them busy
  double gflops = 0;     // threads x fma_units x lanes x 2 x clock_ghz
};

// Runs `threads` OpenMP threads at once; each times a chain of dependent
// integer adds (one cycle each on every x86-64 core: its clock) and
// independent FMAs at the widest vector width (its FLOPs per cycle, rounded
// to whole FMA units). Takes well under 0.1 s.
FmaPeak measure_fma_peak(int threads);

struct MachinePeak {
  double gflops = 0;  // what MFU divides by
  // "fma", or "sgemm" when the measured sgemm beat the FMA figure (which
  // means the clock or unit count read low; the sgemm is then the better
  // bound).
  std::string source;
  FmaPeak fma;
  double sgemm_gflops = 0;
  // One line for users, naming the figure and how it was found, e.g.
  // "FMA peak: 2 threads x 2 FMA units x 16 fp32 lanes x 2 x 2.90 GHz = 371 GFLOP/s",
  // or "measured sgemm peak = 420 GFLOP/s, above the FMA peak (...)": the
  // first " = " precedes the figure used.
  std::string description;
};

// The FMA peak for `threads` threads, or `sgemm_gflops` (a measured sgemm
// rate with the same threads) when that is higher.
MachinePeak machine_peak(int threads, double sgemm_gflops);

// Picks between an FMA measurement and an sgemm rate, as machine_peak does.
MachinePeak choose_peak(const FmaPeak& fma, double sgemm_gflops);

}  // namespace brigade::cpu

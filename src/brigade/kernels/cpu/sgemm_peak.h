// This machine's fp32 matrix-multiply peak, measured: the denominator of MFU
// on CPU (there is no datasheet number for "2 cores of some EPYC in a VM").
#pragma once

namespace brigade::cpu {

// Best GFLOP/s of a few large square sgemms with the current thread count.
// Takes about a quarter of a second.
double measure_sgemm_peak_gflops();

}  // namespace brigade::cpu

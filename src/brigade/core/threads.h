// One knob for CPU threads. Our kernels use OpenMP, and so does the GEMM
// backend (Debian's oneDNN is built on the same OpenMP runtime), so the
// OpenMP thread count sizes both.
#pragma once

namespace brigade {

// Sets the threads used by our kernels and by the GEMMs. n <= 0 means "all cores".
void set_num_threads(int n);
int num_threads();

}  // namespace brigade

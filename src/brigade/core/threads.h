// One knob for CPU threads. Our kernels use OpenMP and OpenBLAS (its OpenMP
// build) uses the same runtime, so setting the OpenMP thread count sizes both;
// OpenBLAS also keeps its own count, which we set alongside so the two agree.
#pragma once

namespace brigade {

// Sets the threads used by our kernels and by BLAS. n <= 0 means "all cores".
void set_num_threads(int n);
int num_threads();

}  // namespace brigade

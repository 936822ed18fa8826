#include "brigade/core/threads.h"

#include <omp.h>

#include <cstdlib>
#include <thread>

namespace brigade {

void set_num_threads(int n) {
  // The launcher splits the cores among a node's workers through
  // OMP_NUM_THREADS, which OpenMP has already read.
  if (n <= 0 && std::getenv("OMP_NUM_THREADS") != nullptr) n = omp_get_max_threads();
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace brigade

#include "brigade/kernels/cpu/fma_peak.h"

#include <fmt/format.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <vector>

#include "brigade/kernels/cpu/isa.h"

namespace brigade::cpu {
namespace {

constexpr int kAddsPerIteration = 64;
constexpr int kAvx512Accumulators = 16;
constexpr int kAvx2Accumulators = 12;  // + 2 operands: 14 of the 16 ymm registers

// The sink that keeps the compiler from dropping the measured loops.
volatile uint64_t g_sink_int = 0;
volatile float g_sink_float = 0;

// 64 dependent register adds per iteration: 64 cycles on any x86-64 core
// (the loop counter is a separate chain that runs alongside). A register
// operand, not an immediate: newer cores fold chains of immediate adds.
void add_chain(int64_t iterations) {
  uint64_t x = 0;
  const uint64_t one = 1;
  for (int64_t i = 0; i < iterations; ++i) {
    asm volatile(".rept 64\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(one));
  }
  g_sink_int = x;
}

// Independent FMA chains, more of them than latency x units on any core, so
// the FMA ports alone set the pace. acc = acc * m + b converges to b / (1 - m):
// no overflow, no denormals.
__attribute__((target("avx512f"))) void fma_chains_avx512(int64_t iterations) {
  const __m512 m = _mm512_set1_ps(0.999f);
  const __m512 b = _mm512_set1_ps(1e-3f);
  __m512 acc[kAvx512Accumulators];
  for (int k = 0; k < kAvx512Accumulators; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kAvx512Accumulators; ++k) acc[k] = _mm512_fmadd_ps(acc[k], m, b);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < kAvx512Accumulators; ++k) sum = _mm512_add_ps(sum, acc[k]);
  alignas(64) float out[16];
  _mm512_store_ps(out, sum);
  g_sink_float = out[0] + out[15];
}

__attribute__((target("avx2,fma"))) void fma_chains_avx2(int64_t iterations) {
  const __m256 m = _mm256_set1_ps(0.999f);
  const __m256 b = _mm256_set1_ps(1e-3f);
  __m256 acc[kAvx2Accumulators];
  for (int k = 0; k < kAvx2Accumulators; ++k) acc[k] = _mm256_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAvx2Accumulators; ++k) acc[k] = _mm256_fmadd_ps(acc[k], m, b);
  }
  __m256 sum = acc[0];
  for (int k = 1; k < kAvx2Accumulators; ++k) sum = _mm256_add_ps(sum, acc[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, sum);
  g_sink_float = out[0] + out[7];
}

// Seconds this thread spent running `loop`: its own CPU time, so that time
// the scheduler gave to another process (the cores are often shared) is
// not counted.
double seconds_of(void (*loop)(int64_t), int64_t iterations) {
  timespec start{}, end{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  loop(iterations);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
  return static_cast<double>(end.tv_sec - start.tv_sec) +
         static_cast<double>(end.tv_nsec - start.tv_nsec) * 1e-9;
}

// Iterations of `loop` that take about half a millisecond.
int64_t half_ms_of_iterations(void (*loop)(int64_t)) {
  int64_t iterations = 64;
  while (seconds_of(loop, iterations) < 0.125e-3 && iterations < (int64_t{1} << 40)) {
    iterations *= 2;
  }
  return iterations * 4;
}

// Clock and FLOPs per cycle of the calling thread, from 48 pairs of ~0.5 ms
// runs, the add chain then the (warmed) FMA loop, back to back. Whatever
// disturbs a run (the hypervisor or an interrupt cutting into it, the other
// vCPU on the same physical core for a while, a cold vector unit) only ever
// makes it read slow, and the thread's CPU clock counts time stolen by the
// host as its own. So both figures are the fastest run seen: the clock is
// the fastest add run, the FMA rate the fastest FMA run. Pairs, because a
// host that moves the clock (2.76 GHz in one run here, 2.99 in the others)
// moves both runs of a pair alike, and the fastest of each then comes from
// the same clock state. (A ratio per pair at the upper quartile, as before,
// read 3 FMA units per core on a CI machine: there the add runs were slowed
// more often than the FMA runs.)
struct ThreadRates {
  double clock_hz = 0;
  double flops_per_cycle = 0;
};

ThreadRates measure_thread(void (*fma_loop)(int64_t), double flops_per_iteration,
                           int64_t add_iterations, int64_t fma_iterations) {
  constexpr int kPairs = 48;
  double best_hz = 0, best_flops = 0;
  for (int pair = 0; pair < kPairs; ++pair) {
    const double hz = static_cast<double>(add_iterations) * kAddsPerIteration /
                      seconds_of(add_chain, add_iterations);
    // Untimed first: a core that has not run wide FMAs for a while powers
    // part of its vector unit down and runs them slowly until it is back
    // (and may change its clock for them); the add chain just gave it time
    // to. Timed cold, 2 FMA units read as 1 (seen here at start-up).
    fma_loop(fma_iterations);
    const double flops = static_cast<double>(fma_iterations) * flops_per_iteration /
                         seconds_of(fma_loop, fma_iterations);
    best_hz = std::max(best_hz, hz);
    best_flops = std::max(best_flops, flops);
  }
  return {best_hz, best_flops / best_hz};
}

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

std::string describe_fma(const FmaPeak& f) {
  return fmt::format("{} x {} x {} fp32 lanes x 2 x {:.2f} GHz = {:.0f} GFLOP/s",
                     plural(f.threads, "thread"), plural(f.fma_units, "FMA unit"), f.lanes,
                     f.clock_ghz, f.gflops);
}

}  // namespace

FmaPeak measure_fma_peak(int threads) {
  threads = std::max(1, threads);
  const bool wide = cpu_features().avx512;
  const int lanes = wide ? 16 : 8;
  const int accumulators = wide ? kAvx512Accumulators : kAvx2Accumulators;
  void (*fma_loop)(int64_t) = wide ? fma_chains_avx512 : fma_chains_avx2;
  std::vector<ThreadRates> rates(threads);
  // All threads measure at once: two vCPUs on one physical core share its
  // FMA units, and all-core clocks are lower than one core's turbo.
#pragma omp parallel num_threads(threads)
  {
    // A runtime that gives fewer threads than asked leaves zeros, skipped below.
    const int t = omp_get_thread_num();
    const int64_t add_iterations = half_ms_of_iterations(add_chain);
    const int64_t fma_iterations = half_ms_of_iterations(fma_loop);
#pragma omp barrier
    rates[t] = measure_thread(fma_loop, accumulators * lanes * 2.0, add_iterations, fma_iterations);
  }
  FmaPeak peak;
  peak.threads = 0;
  peak.lanes = lanes;
  double clock_sum = 0, flops_per_cycle_sum = 0;
  for (const ThreadRates& r : rates) {
    if (r.clock_hz <= 0) continue;
    ++peak.threads;
    clock_sum += r.clock_hz;
    flops_per_cycle_sum += r.flops_per_cycle;
  }
  const double units = flops_per_cycle_sum / peak.threads / (2.0 * lanes);
  // The ratio reads low, never high: the add chain runs at the clock of
  // ordinary code, the FMA loop at the one the core holds under wide-vector
  // load, which can be lower (AVX-512 frequency levels; 0.92 of a unit per
  // unit here). So a quarter of a unit above a whole number is the next one.
  // And no x86-64 core retires more than two vector FMAs a cycle (Intel
  // through Granite Rapids, AMD through Zen 5): a reading above is a
  // disturbed measurement, not a third unit.
  peak.fma_units = std::clamp(static_cast<int>(std::floor(units + 0.75)), 1, 2);
  peak.clock_ghz = clock_sum / peak.threads * 1e-9;
  peak.gflops = peak.threads * peak.fma_units * lanes * 2.0 * peak.clock_ghz;
  return peak;
}

MachinePeak choose_peak(const FmaPeak& fma, double sgemm_gflops) {
  MachinePeak peak;
  peak.fma = fma;
  peak.sgemm_gflops = sgemm_gflops;
  if (sgemm_gflops > fma.gflops) {
    peak.gflops = sgemm_gflops;
    peak.source = "sgemm";
    peak.description = fmt::format(
        "measured sgemm peak = {:.0f} GFLOP/s, above the FMA peak ({}): the clock or FMA units "
        "read low",
        sgemm_gflops, describe_fma(fma));
  } else {
    peak.gflops = fma.gflops;
    peak.source = "fma";
    peak.description = "FMA peak: " + describe_fma(fma);
  }
  return peak;
}

MachinePeak machine_peak(int threads, double sgemm_gflops) {
  return choose_peak(measure_fma_peak(threads), sgemm_gflops);
}

}  // namespace brigade::cpu

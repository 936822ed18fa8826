// The kernels of one GPT-2 small training step (B=4, T=256, C=768, H=12):
// each GEMM in the transpose layout the model uses, against the square-sgemm
// peak, and the non-GEMM kernels, so "where does the step go" has a number
// per kernel.
//   build/bench/kernels_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/attention.h"
#include "brigade/kernels/cpu/gelu.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/layernorm.h"
#include "brigade/kernels/cpu/lm_head_loss.h"
#include "brigade/kernels/cpu/vector_ops.h"
#include "brigade/parallel/replica_check.h"

namespace {
using brigade::FloatBuffer;

// C (m,n) = op(A) op(B), k inner; trans_a/trans_b as the model calls them.
void gemm_shape(benchmark::State& state, bool trans_a, bool trans_b) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  FloatBuffer a(m * k), b(k * n), c(m * n);
  for (int64_t i = 0; i < a.size(); ++i) a.data()[i] = 0.001f * static_cast<float>(i % 97);
  for (int64_t i = 0; i < b.size(); ++i) b.data()[i] = 0.001f * static_cast<float>(i % 89);
  for (auto _ : state) {
    brigade::cpu::gemm(trans_a, trans_b, m, n, k, 1.0f, a.data(), trans_a ? m : k, b.data(),
                       trans_b ? k : n, 1.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

void forward_nn(benchmark::State& s) {
  gemm_shape(s, false, false);
}  // y = x W
void backward_nt(benchmark::State& s) {
  gemm_shape(s, false, true);
}  // dx = dy W^T
void backward_tn(benchmark::State& s) {
  gemm_shape(s, true, false);
}  // dW = x^T dy

// N = 1024 rows; C = 768.
BENCHMARK(forward_nn)->Args({1536, 1536, 1536})->Name("square_1536")->UseRealTime();
BENCHMARK(forward_nn)->Args({1024, 2304, 768})->Name("c_attn_fwd")->UseRealTime();
BENCHMARK(backward_nt)->Args({1024, 768, 2304})->Name("c_attn_dx")->UseRealTime();
BENCHMARK(backward_tn)->Args({768, 2304, 1024})->Name("c_attn_dw")->UseRealTime();
BENCHMARK(forward_nn)->Args({1024, 3072, 768})->Name("c_fc_fwd")->UseRealTime();
BENCHMARK(backward_nt)->Args({1024, 768, 3072})->Name("c_fc_dx")->UseRealTime();
BENCHMARK(backward_tn)->Args({768, 3072, 1024})->Name("c_fc_dw")->UseRealTime();
BENCHMARK(forward_nn)->Args({1024, 768, 3072})->Name("mlp_proj_fwd")->UseRealTime();
BENCHMARK(backward_tn)->Args({3072, 768, 1024})->Name("mlp_proj_dw")->UseRealTime();
// LM head, one 667-row chunk: logits = x wte^T, dx = dlogits wte, dwte += dlogits^T x.
BENCHMARK(backward_nt)->Args({667, 50257, 768})->Name("lm_head_logits")->UseRealTime();
BENCHMARK(forward_nn)->Args({667, 768, 50257})->Name("lm_head_dx")->UseRealTime();
BENCHMARK(backward_tn)->Args({50257, 768, 667})->Name("lm_head_dwte")->UseRealTime();

constexpr int64_t kB = 4, kT = 256, kC = 768, kH = 12, kV = 50257, kN = kB * kT;

FloatBuffer filled(int64_t n, float scale) {
  FloatBuffer b(n);
  for (int64_t i = 0; i < n; ++i) b.data()[i] = scale * static_cast<float>(i % 113 - 56);
  return b;
}

void attention_fwd(benchmark::State& state) {
  FloatBuffer qkv = filled(kN * 3 * kC, 1e-2f), out(kN * kC), lse(kB * kH * kT);
  FloatBuffer scratch(brigade::cpu::attention_scratch_floats(kT, omp_get_max_threads()));
  for (auto _ : state) {
    brigade::cpu::attention_forward(out.data(), lse.data(), qkv.data(), kB, kT, kC, kH,
                                    scratch.data());
  }
}
BENCHMARK(attention_fwd)->UseRealTime()->Unit(benchmark::kMillisecond);

void attention_bwd(benchmark::State& state) {
  FloatBuffer qkv = filled(kN * 3 * kC, 1e-2f), out(kN * kC), lse(kB * kH * kT);
  FloatBuffer dout = filled(kN * kC, 1e-3f), dqkv(kN * 3 * kC);
  FloatBuffer scratch(brigade::cpu::attention_scratch_floats(kT, omp_get_max_threads()));
  brigade::cpu::attention_forward(out.data(), lse.data(), qkv.data(), kB, kT, kC, kH,
                                  scratch.data());
  for (auto _ : state) {
    brigade::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                     kB, kT, kC, kH, scratch.data());
  }
}
BENCHMARK(attention_bwd)->UseRealTime()->Unit(benchmark::kMillisecond);

void lm_head_loss_with_grads(benchmark::State& state) {
  FloatBuffer x = filled(kN * kC, 1e-2f), wte = filled(kV * kC, 1e-3f), dx(kN * kC), dwte(kV * kC),
              losses(kN), scratch(brigade::cpu::lm_head_scratch_floats(kN, kV));
  std::vector<int32_t> targets(kN);
  for (int64_t i = 0; i < kN; ++i) targets[i] = static_cast<int32_t>((i * 7919) % kV);
  for (auto _ : state) {
    brigade::cpu::LmHeadLossArgs a{x.data(),    wte.data(), targets.data(), kN,
                                   kC,          kV,         losses.data(),  dx.data(),
                                   dwte.data(), 1e-3f,      scratch.data()};
    brigade::cpu::lm_head_loss(a);
  }
}
BENCHMARK(lm_head_loss_with_grads)->UseRealTime()->Unit(benchmark::kMillisecond);

void gelu_fwd_bwd(benchmark::State& state) {
  FloatBuffer x = filled(kN * 4 * kC, 1e-2f), y(kN * 4 * kC), g = filled(kN * 4 * kC, 1e-3f);
  for (auto _ : state) {
    brigade::cpu::gelu_forward(y.data(), x.data(), kN * 4 * kC);
    brigade::cpu::gelu_backward(y.data(), g.data(), x.data(), kN * 4 * kC);
  }
}
BENCHMARK(gelu_fwd_bwd)->UseRealTime()->Unit(benchmark::kMillisecond);

void layernorm_fwd_bwd(benchmark::State& state) {
  FloatBuffer x = filled(kN * kC, 1e-2f), y(kN * kC), w = filled(kC, 1e-2f), b(kC), mean(kN),
              rstd(kN), dx(kN * kC), dw(kC), db(kC);
  for (auto _ : state) {
    brigade::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    b.data(), kN, kC);
    brigade::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(),
                                     mean.data(), rstd.data(), w.data(), kN, kC);
  }
}
BENCHMARK(layernorm_fwd_bwd)->UseRealTime()->Unit(benchmark::kMillisecond);

// GPT-2 small's whole AdamW update (124M parameters): memory-bound, 28 bytes
// of traffic per parameter.
void adamw_gpt2_small(benchmark::State& state) {
  const int64_t n = 124439808;
  FloatBuffer p = filled(n, 1e-3f), g = filled(n, 1e-4f), m(n), v(n);
  int64_t step = 0;
  for (auto _ : state) {
    brigade::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                               {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, 1.0f}, {});
  }
  state.counters["GB/s"] =
      benchmark::Counter(28.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(adamw_gpt2_small)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same update writing an in-memory snapshot of what it computes (the
// new p, m and v streamed to a second place: 12 bytes more a parameter),
// against the update alone above plus a separate copy of 12 bytes read and
// written a parameter, which the snapshot cost before.
void adamw_gpt2_small_with_snapshot(benchmark::State& state) {
  const int64_t n = 124439808;
  FloatBuffer p = filled(n, 1e-3f), g = filled(n, 1e-4f), m(n), v(n);
  FloatBuffer snap_p = filled(n, 0.0f), snap_m = filled(n, 0.0f), snap_v = filled(n, 0.0f);
  int64_t step = 0;
  for (auto _ : state) {
    brigade::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                               {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, 1.0f},
                               {snap_p.data(), snap_m.data(), snap_v.data()});
  }
  state.counters["GB/s"] =
      benchmark::Counter(40.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(adamw_gpt2_small_with_snapshot)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same again, also taking the replica check's hash of what it writes
// (cpu::state_hash from L1), against a pass of the check's own over the
// state afterwards (state_hash_gpt2_small, reading 12 bytes a parameter).
void adamw_gpt2_small_with_snapshot_and_hash(benchmark::State& state) {
  const int64_t n = 124439808;
  FloatBuffer p = filled(n, 1e-3f), g = filled(n, 1e-4f), m(n), v(n);
  FloatBuffer snap_p = filled(n, 0.0f), snap_m = filled(n, 0.0f), snap_v = filled(n, 0.0f);
  int64_t step = 0;
  uint64_t hash = 0;
  for (auto _ : state) {
    brigade::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                               {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, 1.0f},
                               {snap_p.data(), snap_m.data(), snap_v.data()}, &hash, 0);
  }
  benchmark::DoNotOptimize(hash);
  state.counters["GB/s"] =
      benchmark::Counter(40.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(adamw_gpt2_small_with_snapshot_and_hash)->UseRealTime()->Unit(benchmark::kMillisecond);

// A pass of `hash` over GPT-2 small's parameters and moments in memory.
template <typename Hash>
void hash_gpt2_small_state(benchmark::State& state, Hash hash) {
  const int64_t n = 124439808;
  FloatBuffer p = filled(n, 1e-3f), m = filled(n, 1e-4f), v = filled(n, 1e-5f);
  for (auto _ : state) benchmark::DoNotOptimize(hash(p.data(), m.data(), v.data(), n));
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}

void state_hash_gpt2_small(benchmark::State& state) {
  hash_gpt2_small_state(state, [](const float* p, const float* m, const float* v, int64_t n) {
    return brigade::cpu::state_hash(p, m, v, n, 0);
  });
}
BENCHMARK(state_hash_gpt2_small)->UseRealTime()->Unit(benchmark::kMillisecond);

// The hash the check took of the same state before (XXH3 of each buffer,
// hash_floats), which a snapshot's writer thread took from memory.
void xxh3_state_gpt2_small(benchmark::State& state) {
  hash_gpt2_small_state(state, [](const float* p, const float* m, const float* v, int64_t n) {
    return brigade::combine_hashes(
        {brigade::hash_floats(p, n), brigade::hash_floats(m, n), brigade::hash_floats(v, n)});
  });
}
BENCHMARK(xxh3_state_gpt2_small)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  brigade::set_num_threads(0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}

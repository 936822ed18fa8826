// Memory and step time of one layout of one job on one kind of hardware.
//
// The step is modelled the way a Megatron-style system runs it:
//   step = pipeline (m micro-batches through the slowest stage, each block's
//          GEMMs, elementwise kernels and tensor-parallel collectives)
//        + bubble ((p-1)/v stage-times of fill and drain)
//        + pipeline transfers (activations and their gradients, blocking)
//        + exposed data-parallel communication (what overlap cannot hide)
//        + optimizer step (streams the state once).
// A GEMM costs max(FLOPs / (peak * gemm_efficiency), bytes / achievable
// bandwidth), so small or skinny GEMMs (attention with head_dim 64-128,
// micro-batch 1 under wide tensor parallelism) are as slow as they really are.
// Elementwise kernels cost the bytes they stream. Collectives are NCCL rings:
// 2 (n-1)/n * bytes / bus bandwidth + a latency per hop.
#pragma once

#include <string>

#include "brigade/schedule/simulate.h"
#include "brigade/sim/hardware.h"
#include "brigade/sim/layout.h"
#include "brigade/sim/transformer_formulas.h"

namespace brigade::sim {

struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0, activations = 0, reserved = 0;
  double total() const { return params + grads + optimizer + activations + reserved; }
};

struct TimeEstimate {
  double compute_s = 0;     // GEMMs and elementwise kernels on the slowest stage
  double tp_comm_s = 0;     // tensor-parallel collectives (on the critical path)
  double pp_comm_s = 0;     // blocking pipeline sends and receives
  double dp_exposed_s = 0;  // data-parallel communication not hidden by backward
  double bubble_s = 0;      // pipeline fill and drain
  double optimizer_s = 0;   // the optimizer step
  double step_s() const {
    return compute_s + tp_comm_s + pp_comm_s + dp_exposed_s + bubble_s + optimizer_s;
  }
  // Time spent waiting on other GPUs rather than computing.
  double waiting_s() const { return tp_comm_s + pp_comm_s + dp_exposed_s + bubble_s; }
};

struct Estimate {
  Layout layout;
  bool valid = false;   // the layout can run this job at all
  std::string invalid;  // why not, when !valid
  bool fits = false;    // memory.total() <= the device's memory
  int64_t num_microbatches = 0;
  MemoryEstimate memory;             // per GPU, on the most loaded stage
  MemoryEstimate last_stage_memory;  // per GPU on the last (the LM head's)
  TimeEstimate time;
  // The pass times of one micro-batch the schedule was simulated with (the
  // bubble's source): the first stage's, a middle one's and the last's,
  // with the LM head's work in the passes the executor runs it in.
  schedule::StageCosts first_stage, middle_stage, last_stage;
  double dp_comm_s = 0;       // all data-parallel traffic, hidden or not
  double model_flops = 0;     // per step, no recompute
  double hardware_flops = 0;  // per step, recompute counted as Megatron-LM does
  double tflops_per_gpu = 0;  // hardware_flops / (step * gpus) / 1e12
  // model_flops / (step * gpus * peak). Like Megatron-LM and PaLM it counts
  // the full s^2 attention term, while a causal fused kernel does half of
  // it: at very long sequences MFU can exceed the GEMM efficiency.
  double mfu = 0;
  double tokens_per_s = 0;
};

// Checks that `layout` can run `job` (sizes divide, tp inside a node, ...) and
// estimates it. Never throws for a layout that cannot run: the reason is in
// Estimate::invalid, so a search can count it.
Estimate estimate(const Workload& job, const Layout& layout, const Hardware& hw);

// Time of one ring collective moving `bytes` per rank over `ranks` ranks;
// `ring_factor` is 2 (n-1)/n for all-reduce and (n-1)/n for reduce-scatter
// or all-gather: ring_factor * bytes / bus + ring_factor * n hops (2 (n-1)
// steps of an all-reduce ring, n-1 of the others).
double ring_collective_s(double bytes, int64_t ranks, double ring_factor, double bus_bytes_per_s,
                         double hop_latency_s);

}  // namespace brigade::sim

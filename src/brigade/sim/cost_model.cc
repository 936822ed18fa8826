#include "brigade/sim/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "brigade/sim/pipeline.h"

namespace brigade::sim {
namespace {

// Forward, backward and recompute cost of one piece of work, split into the
// time the GPU computes and the time it waits on tensor-parallel peers.
struct PassCost {
  double fwd = 0, bwd = 0, recompute = 0;  // compute
  double bwd_weight = 0;                   // the weight-gradient GEMMs, part of bwd
  double bwd_in_fwd = 0;  // backward work run inside the forward pass (the head's), part of bwd
  double bwd_weight_in_fwd = 0;  // of which weight gradients, part of bwd_weight too
  double fwd_tp = 0, bwd_tp = 0, recompute_tp = 0;  // tensor-parallel collectives
  double compute() const { return fwd + bwd + recompute; }
  double tp() const { return fwd_tp + bwd_tp + recompute_tp; }
  double total() const { return compute() + tp(); }
};

class Costs {
 public:
  Costs(const Hardware& hw, const SystemFeatures& f) : hw_(hw), f_(f) {}

  // `batch` independent (m x k) @ (k x n) products in one kernel.
  double gemm_s(double m, double n, double k, double batch = 1) const {
    const double flops = 2.0 * m * n * k * batch;
    const double bytes = f_.act_bytes * (m * k + k * n + m * n) * batch;
    const double efficiency = hw_.gemm_efficiency * curve_efficiency(2.0 * m * n * k);
    return std::max(flops / (hw_.peak_flops * efficiency), stream_s(bytes)) + hw_.kernel_overhead_s;
  }
  // Forward (m x k)(k x n) plus its two backward products, dX = dY W^T
  // (m x n)(n x k) and dW = X^T dY (k x m)(m x n).
  void add_gemm(PassCost& c, double m, double n, double k, double batch = 1) const {
    c.fwd += gemm_s(m, n, k, batch);
    const double weight = gemm_s(k, n, m, batch);
    c.bwd += gemm_s(m, k, n, batch) + weight;
    c.bwd_weight += weight;
  }
  // Elementwise kernels streaming `elements` activations forward; backward
  // reads the saved input and the incoming gradient and writes one: twice.
  void add_elementwise(PassCost& c, double elements, int kernels) const {
    const double bytes = elements * f_.act_bytes;
    c.fwd += stream_s(bytes, bytes / kernels) + kernels * hw_.kernel_overhead_s;
    c.bwd += stream_s(2.0 * bytes, bytes / kernels) + 2 * kernels * hw_.kernel_overhead_s;
  }
  // Time to stream `bytes` through kernels that each touch `working_set`.
  double stream_s(double bytes, double working_set) const {
    if (hw_.cache_bytes > 0 && working_set <= hw_.cache_bytes) {
      return bytes / hw_.cache_bytes_per_s;
    }
    return bytes / (hw_.memory_bytes_per_s * hw_.memory_efficiency);
  }
  double stream_s(double bytes) const { return stream_s(bytes, bytes); }
  // The measured size curve, linear in log(FLOPs) between its points and
  // flat beyond them.
  double curve_efficiency(double flops) const {
    const auto& curve = hw_.gemm_curve;
    if (curve.empty()) return 1.0;
    if (flops <= curve.front().first) return curve.front().second;
    for (size_t i = 1; i < curve.size(); ++i) {
      if (flops <= curve[i].first) {
        const double x =
            std::log(flops / curve[i - 1].first) / std::log(curve[i].first / curve[i - 1].first);
        return curve[i - 1].second + x * (curve[i].second - curve[i - 1].second);
      }
    }
    return curve.back().second;
  }
  double intra_bus() const { return hw_.intra_bytes_per_s * hw_.intra_efficiency; }
  double inter_bus() const { return hw_.inter_bytes_per_s * hw_.inter_efficiency; }

 private:
  const Hardware& hw_;
  const SystemFeatures& f_;
};

// Core attention (scores, softmax, dropout, attention over values) of one
// block, per micro-batch on one GPU: a/t heads of b sequences.
PassCost attention_cost(const Costs& costs, const Workload& job, const Layout& l,
                        const Hardware& hw) {
  const double s = static_cast<double>(job.seq_len), b = static_cast<double>(l.micro);
  const double t = static_cast<double>(l.tp), h = static_cast<double>(job.model.n_embd);
  const double heads = static_cast<double>(job.model.n_head) / t;
  const double head_dim = h / static_cast<double>(job.model.n_head);
  PassCost c;
  if (job.features.flash_attention) {
    // One fused kernel; causal masking skips half of the s x s tiles, and the
    // backward (which recomputes the scores) does 2.5x the forward's work.
    const double flops = 0.5 * 4.0 * b * s * s * h / t;
    c.fwd = flops / (hw.peak_flops * hw.attention_efficiency) + hw.kernel_overhead_s;
    c.bwd = 2.5 * flops / (hw.peak_flops * hw.attention_efficiency) + hw.kernel_overhead_s;
    return c;
  }
  costs.add_gemm(c, s, s, head_dim, b * heads);  // scores = Q K^T
  costs.add_gemm(c, s, head_dim, s, b * heads);  // context = P V
  c.bwd_weight = 0;  // both operands are activations: all of it is input gradient
  // Scale-mask-softmax reads and writes the scores; dropout reads them,
  // writes its output and a one-byte mask.
  const double scores = b * heads * s * s;
  costs.add_elementwise(c, scores * (job.features.attention_dropout ? 4.5 : 2.0),
                        job.features.attention_dropout ? 2 : 1);
  return c;
}

// One transformer block, per micro-batch on one GPU.
PassCost block_cost(const Costs& costs, const Workload& job, const Layout& l, const Hardware& hw) {
  const double s = static_cast<double>(job.seq_len), b = static_cast<double>(l.micro);
  const double t = static_cast<double>(l.tp), h = static_cast<double>(job.model.n_embd);
  const double tokens = b * s;
  PassCost c;
  costs.add_gemm(c, tokens, 3.0 * h / t, h);  // QKV (column parallel)
  costs.add_gemm(c, tokens, h, h / t);        // attention projection (row parallel)
  costs.add_gemm(c, tokens, 4.0 * h / t, h);  // fc1 (column parallel)
  costs.add_gemm(c, tokens, h, 4.0 * h / t);  // fc2 (row parallel)
  const PassCost attention = attention_cost(costs, job, l, hw);
  c.fwd += attention.fwd;
  c.bwd += attention.bwd;  // no weights: all input gradient
  // Two LayerNorms (read + write) and two bias-dropout-adds (read output and
  // residual, write sum and mask): replicated across tp unless sequence
  // parallel shards them. Bias + GELU streams the 4h-wide activations.
  costs.add_elementwise(c, 11.0 * tokens * h / (l.sp ? t : 1.0), 4);
  costs.add_elementwise(c, 8.0 * tokens * h / t, 1);

  if (l.tp > 1) {
    // Megatron's f/g operators: two all-reduces forward, two backward
    // (with sequence parallelism, reduce-scatter + all-gather: same bytes).
    const double bytes = tokens * h * job.features.act_bytes;
    const double one =
        ring_collective_s(bytes, l.tp, 2.0 * (t - 1.0) / t, costs.intra_bus(), hw.intra_latency_s);
    c.fwd_tp = 2.0 * one;
    c.bwd_tp = 2.0 * one;
    // Sequence parallelism keeps only the 1/t sequence shard of each column-
    // parallel GEMM's input, so backward all-gathers it again for the weight
    // gradient (Korthikanti et al. 2022, section 4.2.2): two more all-gathers.
    if (l.sp) c.bwd_tp += one;
  }
  if (l.recompute == PlanRecompute::kFull) {
    c.recompute = c.fwd;
    c.recompute_tp = c.fwd_tp;
  } else if (l.recompute == PlanRecompute::kSelective) {
    c.recompute = attention.fwd;
  }
  return c;
}

// Token + position embedding (first stage): gather, add, dropout; the
// vocabulary-parallel lookup ends in an all-reduce.
PassCost embedding_cost(const Costs& costs, const Workload& job, const Layout& l,
                        const Hardware& hw) {
  const double tokens = static_cast<double>(l.micro * job.seq_len);
  const double h = static_cast<double>(job.model.n_embd), t = static_cast<double>(l.tp);
  PassCost c;
  costs.add_elementwise(c, 4.0 * tokens * h, 3);
  if (l.tp > 1) {
    c.fwd_tp = ring_collective_s(tokens * h * job.features.act_bytes, l.tp, 2.0 * (t - 1.0) / t,
                                 costs.intra_bus(), hw.intra_latency_s);
  }
  return c;
}

// Final LayerNorm, LM head and vocabulary-parallel cross-entropy (last
// stage). Cross-entropy works on fp32 logits: a few passes over b s V / t.
PassCost logits_cost(const Costs& costs, const Workload& job, const Layout& l, const Hardware& hw) {
  const double tokens = static_cast<double>(l.micro * job.seq_len);
  const double h = static_cast<double>(job.model.n_embd), t = static_cast<double>(l.tp);
  const double vocab = static_cast<double>(job.model.vocab_size);
  PassCost c;
  costs.add_elementwise(c, 2.0 * tokens * h, 1);
  const double ln_f_bwd = c.bwd;
  costs.add_gemm(c, tokens, vocab / t, h);
  costs.add_elementwise(c, 4.0 * tokens * vocab / t * (4.0 / job.features.act_bytes), 3);
  // The cross-entropy's backward and the head's input-gradient GEMM, and
  // its weight-gradient GEMM unless ZB-H1 defers that to W.
  if (job.features.head_backward_in_forward) {
    if (l.pipeline_schedule() != schedule::Kind::kZbH1) c.bwd_weight_in_fwd = c.bwd_weight;
    c.bwd_in_fwd = c.bwd - c.bwd_weight - ln_f_bwd + c.bwd_weight_in_fwd;
  }
  if (l.tp > 1) {
    // max, sum of exponentials and target logit: three tiny all-reduces.
    c.fwd_tp = 3.0 * ring_collective_s(tokens * 4.0, l.tp, 2.0 * (t - 1.0) / t, costs.intra_bus(),
                                       hw.intra_latency_s);
    // The column-parallel LM head's input gradient is summed over tp (with
    // sequence parallelism its input is all-gathered first: the same bytes).
    c.bwd_tp = ring_collective_s(tokens * h * job.features.act_bytes, l.tp, 2.0 * (t - 1.0) / t,
                                 costs.intra_bus(), hw.intra_latency_s);
  }
  return c;
}

std::string why_invalid(const Workload& job, const Layout& l, const Hardware& hw) {
  const GptConfig& m = job.model;
  if (l.tp > hw.gpus_per_node) {
    return fmt::format("tp={} spans nodes ({} GPUs per node)", l.tp, hw.gpus_per_node);
  }
  if (hw.gpus_per_node % l.tp != 0) {
    return fmt::format("tp={} does not divide the {} GPUs of a node", l.tp, hw.gpus_per_node);
  }
  if (m.n_head % l.tp != 0) return fmt::format("{} heads do not split over tp={}", m.n_head, l.tp);
  if (m.n_layer % (l.pp * l.vp) != 0) {
    return fmt::format("{} layers do not split into pp*vp={} chunks", m.n_layer, l.pp * l.vp);
  }
  if (job.global_batch % (l.dp * l.micro) != 0) {
    return fmt::format("global batch {} is not a multiple of dp*micro={}", job.global_batch,
                       l.dp * l.micro);
  }
  const int64_t m_count = job.global_batch / (l.dp * l.micro);
  if (l.vp > 1 && (l.pp == 1 || m_count % l.pp != 0)) {
    return "virtual stages need pp > 1 and micro-batches divisible by pp";
  }
  const schedule::Kind kind = l.pipeline_schedule();
  if (l.vp > 1 && kind != schedule::Kind::kInterleaved) {
    return fmt::format("the {} schedule has no virtual stages (set vp=1 or schedule=interleaved)",
                       schedule::kind_name(kind));
  }
  if (l.vp == 1 && kind == schedule::Kind::kInterleaved) {
    return "the interleaved schedule needs vp >= 2";
  }
  if (l.pp > 1 && std::find(job.features.schedules.begin(), job.features.schedules.end(), kind) ==
                      job.features.schedules.end()) {
    return fmt::format("the modelled software does not run the {} schedule",
                       schedule::kind_name(kind));
  }
  if (l.sp && l.tp == 1) return "sequence parallelism needs tp > 1";
  if (l.pp > 1 && kind == schedule::Kind::kZbH1 && l.recompute == PlanRecompute::kFull) {
    return "ZB-H1 defers weight gradients, which needs every block's activations; full "
           "recompute keeps one block's (Brigade refuses it too)";
  }
  if (l.recompute == PlanRecompute::kSelective && job.features.flash_attention) {
    return "selective recompute drops the attention scores, which fused attention never keeps";
  }
  if (l.zero >= 2 && l.pp > 1) {
    return "ZeRO 2/3 with pipeline parallelism are not modelled (Megatron-LM and DeepSpeed refuse "
           "them; Brigade runs ZeRO 2 with pp)";
  }
  return "";
}

// A data-parallel group across this machine's nodes (hardware.h:
// hierarchical_nodes): each collective's time, and the part of it that is
// only a slow link's waiting rather than the cores' work.
struct CpuNodesDp {
  double reduce_grads = 0, gather_weights = 0;
  double reduce_grads_wire = 0, gather_weights_wire = 0;
};

CpuNodesDp cpu_nodes_dp(const Hardware& hw, const Layout& l, double grads, double weights) {
  CpuNodesDp c;
  // Over TCP: the cores move the bytes at tcp_cpu_bytes_per_s, shared as
  // cpu_comm_share says among the `active` workers of the machine that run
  // TCP at once; a link slower than that adds waiting.
  auto tcp = [&](double bytes, int64_t ranks, double factor, int64_t active, double& wire) {
    const double link = hw.inter_bytes_per_s * hw.inter_efficiency;
    const double rate = hw.tcp_cpu_bytes_per_s * cpu_comm_share(hw, active);
    const double cpu = ring_collective_s(bytes, ranks, factor, rate, hw.inter_latency_s);
    const double all =
        ring_collective_s(bytes, ranks, factor, std::min(rate, link), hw.inter_latency_s);
    wire += all - cpu;
    return all;
  };
  const double d = static_cast<double>(l.dp);
  if (l.tp > 1 || l.pp > 1) {
    // Only the world is hierarchical (cli/cmd_train.cc); a smaller group
    // spanning nodes is one flat Gloo ring, its in-node edges over loopback
    // TCP as well. With tp > 1 every group's ring runs at once, so each of
    // the machine's workers does TCP. With pp > 1 that is an approximation
    // which leans slow: the schedule (1F1B) ends the stages' backwards one
    // after the other, last stage first, so their groups' all-reduces start
    // staggered and overlap only in part.
    c.reduce_grads = tcp(grads, l.dp, (l.zero == 0 ? 2.0 : 1.0) * (d - 1.0) / d, hw.machine_workers,
                         c.reduce_grads_wire);
    c.gather_weights = tcp(weights, l.dp, (d - 1.0) / d, hw.machine_workers, c.gather_weights_wire);
    return c;
  }
  // comm/hierarchical_communicator.h: inside each node among its k members
  // (the staged shm path: the backend lends the trainer no shared buffer),
  // among the n leaders over the links, then the leader's result broadcast
  // inside the node (it writes the segment, the others read it).
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(hw.gpus_per_node, l.dp));
  const int64_t n = std::max<int64_t>(1, l.dp / k);
  const double kk = static_cast<double>(k), nn = static_cast<double>(n);
  auto node = [&](double bytes, double factor) {
    return ring_collective_s(bytes, k, factor, hw.node_bytes_per_s, hw.node_latency_s);
  };
  // Only the leaders run TCP (one per node; on namespace nodes every node's
  // leader shares this machine), while the other members wait for their
  // broadcast. That wait (comm/shm_communicator.cc: wait_for) takes little
  // of the leaders' CPU, not none: 4000 pause instructions (microseconds),
  // then sched_yield for up to 1 ms (a busy loop, but one that hands the
  // core to a runnable leader that shares it), then 50 us naps, each a
  // wake-up of a few microseconds. Against a TCP phase of tens of
  // milliseconds that is a few percent of a core, left out here.
  const int64_t leaders_here = std::max<int64_t>(1, hw.machine_workers / k);
  c.reduce_grads = node(grads, 2.0 * (kk - 1.0) / kk) +
                   tcp(grads, n, 2.0 * (nn - 1.0) / nn, leaders_here, c.reduce_grads_wire) +
                   node(grads, 1.0);
  if (l.zero >= 1) {
    // Its reduce-scatter is an all-reduce of a fresh copy of the bucket:
    // pages to fault in, then read and write, by every worker at once (both
    // rates carry the worker's share of the cores: this_machine.cc).
    c.reduce_grads += 2.0 * grads / hw.memory_bytes_per_s +
                      (hw.refault_bytes_per_s > 0 ? grads / hw.refault_bytes_per_s : 0.0);
  }
  // A node gathers its members' shards (1/n of the whole), the leaders the nodes'.
  c.gather_weights = node(weights / nn, (kk - 1.0) / kk) +
                     tcp(weights, n, (nn - 1.0) / nn, leaders_here, c.gather_weights_wire) +
                     node(weights, 1.0);
  return c;
}

}  // namespace

double ring_collective_s(double bytes, int64_t ranks, double ring_factor, double bus_bytes_per_s,
                         double hop_latency_s) {
  if (ranks <= 1) return 0;
  // A ring takes ring_factor * n steps: 2 (n-1) for all-reduce, n-1 for the others.
  return ring_factor * bytes / bus_bytes_per_s +
         ring_factor * static_cast<double>(ranks) * hop_latency_s;
}

Estimate estimate(const Workload& job, const Layout& l, const Hardware& hw) {
  Estimate e;
  e.layout = l;
  e.invalid = why_invalid(job, l, hw);
  if (!e.invalid.empty()) return e;
  e.valid = true;
  const SystemFeatures& f = job.features;
  const Costs costs(hw, f);
  const int64_t m = job.global_batch / (l.dp * l.micro);
  e.num_microbatches = m;
  const double layers_per_stage = static_cast<double>(job.model.n_layer / l.pp);

  // --- time of one micro-batch on each stage ---
  const PassCost block = block_cost(costs, job, l, hw);
  const PassCost embed = embedding_cost(costs, job, l, hw);
  const PassCost logits = logits_cost(costs, job, l, hw);
  auto stage = [&](bool first, bool last) {
    PassCost s;
    auto add = [&s](const PassCost& c, double times) {
      s.fwd += times * c.fwd, s.bwd += times * c.bwd, s.recompute += times * c.recompute;
      s.bwd_weight += times * c.bwd_weight, s.bwd_in_fwd += times * c.bwd_in_fwd;
      s.bwd_weight_in_fwd += times * c.bwd_weight_in_fwd;
      s.fwd_tp += times * c.fwd_tp, s.bwd_tp += times * c.bwd_tp;
      s.recompute_tp += times * c.recompute_tp;
    };
    add(block, layers_per_stage);
    if (first) add(embed, 1);
    if (last) add(logits, 1);
    return s;
  };
  const PassCost first = stage(true, l.pp == 1), last = stage(l.pp == 1, true);
  const PassCost middle = stage(false, false);
  const PassCost& slowest = first.total() >= last.total() ? first : last;

  const double mb = static_cast<double>(m);
  e.time.compute_s = mb * slowest.compute();
  e.time.tp_comm_s = mb * slowest.tp();
  // The bubble is what the schedule's own instruction lists, simulated with
  // these stage times, add to the slowest stage's work: fill, drain, and
  // waits behind slower neighbours. The transfers are not in the simulation:
  // they are counted below as blocking, on the critical path.
  // The passes are split as the executor runs them, under every schedule:
  // with head_backward_in_forward the LM head's loss and input gradients
  // are in the last stage's F, and so is its weight gradient, except under
  // ZB-H1, which runs it in W with the blocks'. (A fused B, all but ZB-H1's,
  // costs B + W.)
  auto split = [](const PassCost& c) {
    const double head_input_in_fwd = c.bwd_in_fwd - c.bwd_weight_in_fwd;
    return schedule::StageCosts{
        c.fwd + c.fwd_tp + c.bwd_in_fwd,
        c.bwd - c.bwd_weight - head_input_in_fwd + c.bwd_tp + c.recompute + c.recompute_tp,
        c.bwd_weight - c.bwd_weight_in_fwd};
  };
  e.first_stage = split(first), e.middle_stage = split(middle), e.last_stage = split(last);
  const PipelineResult pipe =
      simulate_pipeline(schedule::Shape{l.pipeline_schedule(), l.pp, m, l.vp},
                        PipelineCosts{e.first_stage, e.middle_stage, e.last_stage});
  e.time.bubble_s = std::max(0.0, pipe.step_s - mb * slowest.total());

  const double tokens = static_cast<double>(l.micro * job.seq_len);
  const double h = static_cast<double>(job.model.n_embd), t = static_cast<double>(l.tp);
  // Stages are tp * dp ranks apart: unless the whole pipeline sits in one
  // node, some stage boundary crosses nodes, and the synchronous pipeline
  // runs at its slowest link.
  const bool pp_inside_node = l.tp * l.dp * l.pp <= hw.gpus_per_node;
  if (l.pp > 1) {
    // Each tp rank sends its 1/t of the activations and the receivers
    // all-gather them over NVLink (Megatron's scatter/gather; with sequence
    // parallelism the activations are already split, nothing to gather).
    // 1F1B blocks on one send forward and one backward per micro-batch and
    // model chunk.
    const double bytes = tokens * h * f.act_bytes;
    const double link = pp_inside_node ? costs.intra_bus() : costs.inter_bus();
    const double hop = pp_inside_node ? hw.intra_latency_s : hw.inter_latency_s;
    const double gather =
        l.sp ? 0.0
             : ring_collective_s(bytes, l.tp, (t - 1.0) / t, costs.intra_bus(), hw.intra_latency_s);
    const double one = bytes / t / link + hop + gather;
    e.time.pp_comm_s = 2.0 * mb * static_cast<double>(l.vp) * one;
  }

  // --- data-parallel communication ---
  const double params_first = stage_params_per_gpu(job.model, job.seq_len, l, true, l.pp == 1);
  const double params_last = stage_params_per_gpu(job.model, job.seq_len, l, l.pp == 1, true);
  const double params_gpu = std::max(params_first, params_last);
  if (l.dp > 1) {
    // Members of one dp group inside a node share that node's NICs. Groups
    // are consecutive ranks: inside a node only if they tile it.
    const bool inside_node =
        l.tp * l.dp <= hw.gpus_per_node && hw.gpus_per_node % (l.tp * l.dp) == 0;
    const double members_per_node =
        inside_node ? static_cast<double>(l.dp)
                    : std::max(1.0, static_cast<double>(hw.gpus_per_node / l.tp));
    const double bus = inside_node
                           ? costs.intra_bus()
                           : std::min(costs.intra_bus(), members_per_node * costs.inter_bus());
    const double hop = inside_node ? hw.intra_latency_s : hw.inter_latency_s;
    const double d = static_cast<double>(l.dp);
    const double grads = params_gpu * f.grad_bytes, weights = params_gpu * f.param_bytes;
    const double half = (d - 1.0) / d;
    double reduce_grads = ring_collective_s(grads, l.dp, l.zero == 0 ? 2 * half : half, bus, hop);
    double gather_weights = ring_collective_s(weights, l.dp, half, bus, hop);
    // This machine's nodes: Brigade's own backend across them, and what of
    // it a slow link only waits for.
    double grads_wire = 0, weights_wire = 0;
    if (!inside_node && hw.hierarchical_nodes) {
      const CpuNodesDp c = cpu_nodes_dp(hw, l, grads, weights);
      reduce_grads = c.reduce_grads;
      gather_weights = c.gather_weights;
      grads_wire = c.reduce_grads_wire;
      weights_wire = c.gather_weights_wire;
    }
    // Overlap hides communication behind the backward (gradients) or forward
    // (weights) of one micro-batch; the last bucket always shows.
    const double share = std::min(1.0, f.dp_bucket_bytes / std::max(grads, 1.0));
    auto exposed = [&](double comm, double window, double floor_share) {
      return f.overlap_dp ? std::max(comm - window, comm * floor_share) : comm;
    };
    // A slow link's waiting overlaps whatever the system does; the cores'
    // own part of the collective as the system does.
    auto exposed_with_wire = [&](double comm, double wire, double window, double floor_share) {
      return exposed(comm - wire, window, floor_share) +
             (wire > 0 ? std::max(wire - window, wire * floor_share) : 0.0);
    };
    // ZeRO 3 cannot start a micro-batch before its first block is gathered:
    // at least one block's share of each gather shows.
    const double block_share = std::min(1.0, (block_params(h) / t) / std::max(params_gpu, 1.0));
    const double fwd_mb = slowest.fwd + slowest.fwd_tp;
    const double bwd_mb = slowest.bwd + slowest.bwd_tp + slowest.recompute + slowest.recompute_tp;
    // Pages a rank gives back and writes again every step (Brigade's CPU
    // engine): ZeRO 2/3 release the unowned gradient shards after the
    // reduce-scatter; ZeRO 3 also releases each gathered block after its
    // forward and again after its backward. Inside a node the next
    // reduce-scatter reads the released gradient shards in place, each page
    // mapped again into the peer that owns it.
    double refault_s = 0;
    if (hw.refault_bytes_per_s > 0 && l.zero >= 2) {
      const double unowned = (d - 1.0) / d;
      double released = grads * unowned;
      if (l.zero == 3) released += 2.0 * mb * weights * unowned;
      refault_s = released / hw.refault_bytes_per_s;
      if (inside_node && hw.peer_refault_bytes_per_s > 0) {
        refault_s += grads * unowned / hw.peer_refault_bytes_per_s;
      }
    }
    switch (l.zero) {
      case 0:
        e.dp_comm_s = reduce_grads;
        e.time.dp_exposed_s = exposed_with_wire(reduce_grads, grads_wire, bwd_mb, share);
        break;
      case 1:
        e.dp_comm_s = reduce_grads + gather_weights;
        e.time.dp_exposed_s = exposed_with_wire(reduce_grads, grads_wire, bwd_mb, share) +
                              exposed_with_wire(gather_weights, weights_wire, fwd_mb, share);
        break;
      case 2:  // gradients reduce-scattered every micro-batch
        e.dp_comm_s = mb * reduce_grads + gather_weights;
        e.time.dp_exposed_s = mb * exposed_with_wire(reduce_grads, grads_wire, bwd_mb, share) +
                              exposed_with_wire(gather_weights, weights_wire, fwd_mb, share);
        break;
      default:  // 3: weights gathered for forward and again for backward
        e.dp_comm_s = mb * (2.0 * gather_weights + reduce_grads);
        e.time.dp_exposed_s =
            mb * (exposed_with_wire(gather_weights, weights_wire, fwd_mb, block_share) +
                  exposed_with_wire(gather_weights + reduce_grads, weights_wire + grads_wire,
                                    bwd_mb, block_share));
        break;
    }
    e.dp_comm_s += refault_s;
    e.time.dp_exposed_s += refault_s;
  }
  const double optimizer_params = params_gpu / (l.zero >= 1 ? static_cast<double>(l.dp) : 1.0);
  e.time.optimizer_s = hw.optimizer_params_per_s > 0
                           ? optimizer_params / hw.optimizer_params_per_s +
                                 costs.stream_s(optimizer_params * f.optimizer_traffic_bytes)
                           : costs.stream_s(optimizer_params * f.optimizer_traffic_bytes);

  // --- memory on the most loaded GPU (first or last stage) ---
  const double block_act = block_activation_bytes(job.model, job.seq_len, l, f);
  Layout no_recompute = l;
  no_recompute.recompute = PlanRecompute::kNone;
  // Full recompute rebuilds one block's activations at a time in backward.
  const double working = l.recompute == PlanRecompute::kFull
                             ? block_activation_bytes(job.model, job.seq_len, no_recompute, f)
                             : 0.0;
  const double vocab = static_cast<double>(job.model.vocab_size);
  const double logits_bytes = 4.0 * tokens * vocab / t + 4.0 * tokens * h / t;  // fp32 logits
  const double embed_bytes = tokens * h * f.act_bytes / (l.sp ? t : 1.0);
  // ZB-H1 keeps each block's output gradients from a micro-batch's B to its
  // W; Brigade's defers the head's weight gradient there too, each
  // micro-batch the last stage holds keeping its dlogits (N x V/t fp32).
  const bool split_backward = l.pipeline_schedule() == schedule::Kind::kZbH1;
  const double kept_block_bytes =
      split_backward ? split_backward_kept_bytes(job.model, job.seq_len, l, f) : 0.0;
  const double kept_dlogits_bytes =
      f.head_backward_in_forward && split_backward ? 4.0 * tokens * vocab / t : 0.0;
  auto memory_of = [&](double params, double inflight, bool first_stage, bool last_stage) {
    MemoryEstimate mem;
    const StateBytes state = zero_state_bytes(params, l.zero, l.dp, f);
    mem.params = state.params;
    if (l.zero == 3) {
      // Two blocks' gathered weights: the one running and the prefetched next.
      mem.params += 2.0 * (block_params(h) / t) * f.param_bytes;
    }
    mem.grads = state.grads;
    mem.optimizer = state.optimizer;
    mem.activations = layers_per_stage * (block_act + kept_block_bytes) * inflight + working;
    if (first_stage) mem.activations += embed_bytes * inflight;
    if (last_stage) mem.activations += logits_bytes + kept_dlogits_bytes * inflight;
    mem.reserved = hw.reserved_bytes;
    return mem;
  };
  // The activations alive at the peak are the simulated schedule's: p
  // micro-batches on 1F1B's first stage, m under GPipe, Megatron's
  // p (1 + (p-1)/(p v)) interleaved; ZB-H1's later stages also hold the
  // micro-batches whose weight gradients they deferred (the last, up to
  // min(p, m), with their dlogits), each with its blocks' kept gradients.
  const MemoryEstimate mem_first = memory_of(params_first, pipe.live_first, true, l.pp == 1);
  const MemoryEstimate mem_last = memory_of(params_last, pipe.live_last, l.pp == 1, true);
  e.memory = mem_first.total() >= mem_last.total() ? mem_first : mem_last;
  e.last_stage_memory = mem_last;
  e.fits = e.memory.total() <= hw.memory_bytes;

  // --- what the step achieves ---
  const double step = e.time.step_s();
  const double gpus = static_cast<double>(l.gpus());
  e.model_flops = model_flops_per_step(job.model, job.seq_len, job.global_batch);
  e.hardware_flops = hardware_flops_per_step(job.model, job.seq_len, job.global_batch, l.recompute);
  e.tflops_per_gpu = e.hardware_flops / (step * gpus) / 1e12;
  e.mfu = e.model_flops / (step * gpus * hw.peak_flops);
  e.tokens_per_s = static_cast<double>(job.global_batch * job.seq_len) / step;
  return e;
}

}  // namespace brigade::sim

// What the planner knows about an accelerator and the links between them.
//
// Two kinds of numbers live here, kept apart on purpose:
//  - datasheet figures (peak bf16 FLOP/s, HBM size and bandwidth, link
//    bandwidths), which nobody reaches;
//  - efficiency constants, the fraction of each figure that real kernels and
//    NCCL rings reach. There is ONE set per device type, used for every model
//    and layout (no per-run fitting); `brigade plan --validate` shows how well
//    that one set predicts published measurements.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace brigade::sim {

struct Hardware {
  std::string name;         // catalogue key, e.g. "a100-80g"
  std::string description;  // what it is, for the report

  // Datasheet figures, per device.
  double peak_flops = 0;             // dense bf16 (fp32 for this-machine)
  double memory_bytes = 0;           // HBM (RAM share for this-machine)
  double memory_bytes_per_s = 0;     // HBM bandwidth
  int gpus_per_node = 8;             // devices sharing the fast intra-node link
  int64_t cores = 0;                 // this-machine: the calibrated CPU's cores (0: a GPU)
  double intra_bytes_per_s = 0;      // NVLink, per device and direction
  double intra_latency_s = 0;        // one hop inside a node
  double inter_bytes_per_s = 0;      // network per device (one NIC per GPU)
  double inter_latency_s = 0;        // one hop between nodes
  double reserved_bytes = 0;         // context, library workspaces, comm buffers
  double host_copy_bytes_per_s = 0;  // device -> host (snapshot for checkpoints)

  // Efficiency constants (fractions of the figures above).
  double gemm_efficiency = 0;       // large GEMMs, of peak_flops
  double attention_efficiency = 0;  // fused (flash) attention, of peak_flops
  double memory_efficiency = 0;     // streaming elementwise kernels, of HBM bw
  double intra_efficiency = 0;      // NCCL bus bandwidth, of intra_bytes_per_s
  double inter_efficiency = 0;      // NCCL bus bandwidth, of inter_bytes_per_s
  // A last-level cache that streams faster than memory: elementwise kernels
  // whose data fit run at cache_bytes_per_s. 0: not modelled (GPUs, whose
  // activations outgrow L2).
  double cache_bytes = 0;
  double cache_bytes_per_s = 0;
  // Measured AdamW rate, parameters per second; 0: the optimizer step is
  // memory-bound and costs SystemFeatures::optimizer_traffic_bytes per
  // parameter (GPUs). CPUs spend it on square roots and divisions.
  double optimizer_params_per_s = 0;
  // Bytes per second at which pages a ZeRO rank released (Brigade's CPU
  // engine returns unowned shards to the OS) come back when written again;
  // 0: releasing is free (GPU allocators keep the memory). this-machine:
  // each worker's rate, every worker faulting at once (this_machine.cc).
  double refault_bytes_per_s = 0;
  // Bytes per second at which a peer's view of such pages comes back when it
  // reads them in place (the shm reduce-scatter reads the peers' gradient
  // shards where they lie, and the owner's release unmapped them from every
  // process); 0: free, or no such reads.
  double peer_refault_bytes_per_s = 0;
  // GEMM efficiency by size: (FLOPs per call, fraction of the best rate),
  // ascending, interpolated in log(FLOPs) and multiplied into
  // gemm_efficiency. Empty: no size dependence beyond the roofline (GPUs).
  std::vector<std::pair<double, double>> gemm_curve;
  // Fixed cost of one kernel launch or small op; matters for tiny models and
  // for the many small collectives of deep pipelines.
  double kernel_overhead_s = 0;
  // Brigade's CPU backend across nodes (this-machine with --nodes). false:
  // a group spanning nodes is one flat ring (NCCL's), its cross-node edges
  // at the NICs' speed. true: the world's data-parallel group (tp = pp = 1)
  // is hierarchical (comm/hierarchical_communicator.h): a collective runs
  // inside each node on node_bytes_per_s, then among the nodes' leaders over
  // their links (inter_bytes_per_s, one link per node), then a broadcast
  // inside each node; any other group spanning nodes is a flat Gloo ring,
  // every edge TCP. TCP costs the CPU tcp_cpu_bytes_per_s: that much of a
  // transfer is the cores' work, the rest of a slower link's time only
  // waiting, which backward can hide.
  bool hierarchical_nodes = false;
  double node_bytes_per_s = 0;     // the staged shm all-reduce's bus bandwidth
  double node_latency_s = 0;       // one of its hops
  double tcp_cpu_bytes_per_s = 0;  // Gloo's all-reduce bus bandwidth over loopback
  // this-machine: the workers the planned job runs on the calibrated
  // machine's cores (with namespace nodes, every node's), and how many ran
  // the calibration's comm figures side by side. A collective's CPU work
  // (shm's copies and sums, TCP's copies) is the cores' work: when more
  // workers do it at once than there are cores, they share them, and
  // calibrated rates taken with a core per worker are too fast. 0: not
  // modelled (GPUs). node_bytes_per_s and intra_bytes_per_s already carry
  // the share of every machine worker (all of them run those steps at
  // once); tcp_cpu_bytes_per_s is as calibrated, since how many workers run
  // TCP at once depends on the group (cpu_comm_share).
  int64_t machine_workers = 0;
  int64_t comm_calibration_workers = 0;
};

// The part of one core that each of `workers` busy workers gets on `cores`
// cores: min(1, cores / workers).
double core_per_worker(int64_t cores, int64_t workers);

// What a CPU-bound collective phase that `active` of the machine's workers
// run at once achieves, as a fraction of its calibrated rate: each of them
// gets core_per_worker(cores, active), where each calibrating worker got
// core_per_worker(cores, comm_calibration_workers). 1 where not modelled.
// Above 1 when the calibration's workers outnumbered the cores and fewer
// run the phase (`bench calibrate` times 2 workers: on a 1-core machine
// each had half of it, so a lone leader's TCP on a node of its own runs at
// twice the calibrated rate). That is the CPU time's ratio: a phase that
// memory bandwidth, not the cores, holds back gains less.
double cpu_comm_share(const Hardware& hw, int64_t active);

// The catalogue: a100-80g, h100-80g, h200. Throws Error naming the known
// devices when `name` is none of them. "this-machine" is not here: it comes
// from a calibration file (see this_machine.h).
const Hardware& hardware_by_name(const std::string& name);
std::vector<std::string> hardware_names();

}  // namespace brigade::sim

// `--hardware this-machine`: this computer as the planner's hardware, from a
// calibration file that `brigade bench calibrate` writes (the machine's
// peak, measured sgemm curve, memory bandwidth, attention rate, kernel
// overhead, shm all-reduce). The peak is the one `brigade train` takes MFU
// against (the FMA peak, kernels/cpu/fma_peak.h), so the planner's MFU means
// the same; the GEMMs' measured rate enters as gemm_efficiency of it.
//
// A "GPU" here is one worker process. The launcher splits the cores among a
// node's workers, so a device's compute depends on how many share the
// machine: the planner asks for the hardware of `devices_per_node` workers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "brigade/sim/hardware.h"
#include "brigade/sim/layout.h"

namespace brigade::sim {

// $BRIGADE_CALIBRATION, else $XDG_CACHE_HOME/brigade/this-machine.json, else
// ~/.cache/brigade/this-machine.json.
std::string default_calibration_path();

// Throws Error naming the missing or bad field (and `brigade bench
// calibrate` as the fix): calibrations written before the peak was recorded
// are refused, not read with the sgemm as the peak, which would give the
// planner an MFU that the runs do not report. Each device is a worker with
// `threads_per_device` threads (0: the cores split evenly, as the launcher
// splits them); the caller keeps devices x threads within the cores.
//
// `nodes` plans a job across several nodes like this one, joined by links
// of a given rate (`brigade plan --nodes N --link RATE`): a group that spans
// nodes runs as Brigade's hierarchical backend runs it, with the leaders'
// part over TCP (Gloo) at the slower of the link and the Gloo all-reduce
// the calibration measured between two local workers (on a CPU, TCP's
// copies and checksums are often the limit before the wire is).
struct ThisMachineNodes {
  int64_t nodes = 1;
  double link_bytes_per_s = 0;  // each node's link, each direction
  // The nodes are network namespaces of this one machine
  // (scripts/fake_cluster.sh): every node's workers share its cores,
  // memory and last-level cache, each node's launcher splitting all the
  // cores among its own workers (so they are oversubscribed nodes times).
  // The collectives' CPU work shares the cores too: the shm steps, which
  // every worker runs at once, and the TCP of the leaders, which all run on
  // this machine (hardware.h: cpu_comm_share); so do the page faults every
  // worker takes at once under ZeRO (refault_bytes_per_s).
  bool one_machine = false;
};
Hardware this_machine_hardware(const nlohmann::json& calibration, int64_t devices_per_node,
                               int64_t threads_per_device = 0, const ThisMachineNodes& nodes = {});

// "10gbit", "800mbit", "25Gbit" (tc's units, bits per second) -> bytes per
// second. Throws Error naming the form expected.
double parse_link_rate(const std::string& rate);

// One paragraph: peak, GEMMs, bandwidth, attention, overhead, all-reduce.
std::string describe_calibration(const nlohmann::json& calibration);

// What Brigade's CPU engine does: fp32 everywhere (4-byte weights,
// gradients and activations, AdamW's two fp32 moments and no master copy),
// tiled causal attention that keeps no s^2 scores, overlapped buckets.
SystemFeatures brigade_cpu_features();

}  // namespace brigade::sim

#include "brigade/sim/hardware.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Datasheets: NVIDIA A100 (80GB SXM4), H100 SXM5 and H200 SXM product briefs;
// dense (not 2:4 sparse) bf16. Networks as in DGX SuperPOD reference designs:
// one HDR (200 Gb/s) NIC per A100, one NDR (400 Gb/s) NIC per H100/H200.
// The efficiency constants are shared by the three devices (same software
// stack, NCCL rings and cuBLAS); the A100 values were chosen once against the
// rows of src/brigade/sim/published.csv (`brigade plan --validate`).
Hardware with_shared_efficiencies(Hardware h) {
  h.gemm_efficiency = 0.72;
  h.attention_efficiency = 0.55;
  h.memory_efficiency = 0.80;
  h.intra_efficiency = 0.78;
  h.inter_efficiency = 0.85;
  h.kernel_overhead_s = 4e-6;
  h.reserved_bytes = 3.0 * kGiB;
  return h;
}

const std::vector<Hardware>& catalogue() {
  static const std::vector<Hardware> devices = [] {
    std::vector<Hardware> d;
    Hardware a100;
    a100.name = "a100-80g";
    a100.description = "NVIDIA A100 80GB SXM, 8 per node, NVLink 3, one HDR 200 Gb/s NIC per GPU";
    a100.peak_flops = 312e12;
    a100.memory_bytes = 80.0 * kGiB;
    a100.memory_bytes_per_s = 2.039e12;
    a100.intra_bytes_per_s = 300e9;
    a100.intra_latency_s = 3e-6;
    a100.inter_bytes_per_s = 25e9;
    a100.inter_latency_s = 6e-6;
    a100.host_copy_bytes_per_s = 25e9;  // PCIe 4.0 x16
    d.push_back(with_shared_efficiencies(a100));

    Hardware h100;
    h100.name = "h100-80g";
    h100.description = "NVIDIA H100 80GB SXM, 8 per node, NVLink 4, one NDR 400 Gb/s NIC per GPU";
    h100.peak_flops = 989e12;
    h100.memory_bytes = 80.0 * kGiB;
    h100.memory_bytes_per_s = 3.35e12;
    h100.intra_bytes_per_s = 450e9;
    h100.intra_latency_s = 3e-6;
    h100.inter_bytes_per_s = 50e9;
    h100.inter_latency_s = 5e-6;
    h100.host_copy_bytes_per_s = 50e9;  // PCIe 5.0 x16
    d.push_back(with_shared_efficiencies(h100));

    Hardware h200 = d.back();  // the H100 as catalogued, efficiencies included
    h200.name = "h200";
    h200.description = "NVIDIA H200 141GB SXM, 8 per node, NVLink 4, one NDR 400 Gb/s NIC per GPU";
    h200.memory_bytes = 140.0 * kGiB;  // 143,771 MiB as the driver reports it
    h200.memory_bytes_per_s = 4.8e12;
    d.push_back(h200);
    return d;
  }();
  return devices;
}

}  // namespace

const Hardware& hardware_by_name(const std::string& name) {
  for (const Hardware& h : catalogue()) {
    if (h.name == name) return h;
  }
  throw_error("unknown hardware \"{}\": use one of {}, or this-machine", name,
              fmt::join(hardware_names(), ", "));
}

double core_per_worker(int64_t cores, int64_t workers) {
  return std::min(1.0,
                  static_cast<double>(cores) / static_cast<double>(std::max<int64_t>(1, workers)));
}

double cpu_comm_share(const Hardware& hw, int64_t active) {
  if (hw.cores <= 0 || hw.machine_workers <= 0 || hw.comm_calibration_workers <= 0) return 1.0;
  return core_per_worker(hw.cores, active) / core_per_worker(hw.cores, hw.comm_calibration_workers);
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> names;
  for (const Hardware& h : catalogue()) names.push_back(h.name);
  return names;
}

}  // namespace brigade::sim

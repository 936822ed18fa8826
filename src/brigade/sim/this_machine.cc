#include "brigade/sim/this_machine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "brigade/core/error.h"

namespace brigade::sim {
namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, const char* where) {
  if (!j.is_object() || !j.contains(key)) {
    throw_error("calibration: {} has no \"{}\"; rerun `brigade bench calibrate`", where, key);
  }
  return j.at(key);
}

double positive(const nlohmann::json& j, const char* key, const char* where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_number() || v.get<double>() <= 0) {
    throw_error("calibration: {}.{} must be a positive number; rerun `brigade bench calibrate`",
                where, key);
  }
  return v.get<double>();
}

// The measurement taken with the thread count nearest to `threads`.
const nlohmann::json& compute_for(const nlohmann::json& calibration, int64_t threads) {
  const nlohmann::json& all = field(calibration, "compute", "the file");
  if (!all.is_array() || all.empty()) {
    throw_error("calibration: \"compute\" is empty; rerun `brigade bench calibrate`");
  }
  const nlohmann::json* best = &all.front();
  for (const nlohmann::json& c : all) {
    const double have = positive(c, "threads", "compute");
    if (std::fabs(have - static_cast<double>(threads)) <
        std::fabs(positive(*best, "threads", "compute") - static_cast<double>(threads))) {
      best = &c;
    }
  }
  return *best;
}

// The machine's peak for a compute entry's threads (kernels/cpu/fma_peak.h:
// the FMA peak, or the measured sgemm when higher), which calibrations
// before it lack.
double peak_gflops(const nlohmann::json& compute) {
  if (!compute.is_object() || !compute.contains("peak_gflops")) {
    throw_error(
        "calibration: compute has no \"peak_gflops\" (the FMA peak, recorded since MFU is taken "
        "against it rather than against an sgemm); rerun `brigade bench calibrate` (with "
        "--comm-from OLD_FILE it keeps the old all-reduce figures and takes seconds)");
  }
  return positive(compute, "peak_gflops", "compute");
}

// The best rate on a compute entry's GEMM curve ([[flops per call, GFLOP/s], ...]).
double best_gemm_gflops(const nlohmann::json& compute) {
  double best = 0;
  for (const nlohmann::json& point : field(compute, "gemm", "compute")) {
    best = std::max(best, point.at(1).get<double>());
  }
  return best;
}

// A measured all-reduce between two workers, as ring figures: the largest
// size gives the bus bandwidth (2 ranks: busbw = algbw), the smallest the
// latency left over.
struct RingFigures {
  double bus_bytes_per_s = 0;
  double hop_latency_s = 0;
};
RingFigures all_reduce_figures(const nlohmann::json& comm, const char* key) {
  const nlohmann::json& rows = field(comm, key, "comm");
  if (!rows.is_array() || rows.empty()) {
    throw_error("calibration: comm.{} is empty; rerun `brigade bench calibrate`", key);
  }
  const std::string where = std::string("comm.") + key;
  const nlohmann::json& large = rows.back();
  RingFigures r;
  r.bus_bytes_per_s =
      positive(large, "bytes", where.c_str()) / positive(large, "time_s", where.c_str());
  // Latency: the fastest small (<= 16 KiB) all-reduce; one noisy first size
  // must not set it.
  double latency = 1e30;
  for (const nlohmann::json& row : rows) {
    if (positive(row, "bytes", where.c_str()) <= 16384) {
      latency = std::min(latency, positive(row, "time_s", where.c_str()));
    }
  }
  // A 2-rank all-reduce ring is 2 steps (see ring_collective_s).
  r.hop_latency_s = latency < 1e29 ? latency / 2.0 : 0.0;
  return r;
}

// Nodes joined by links of nodes.link_bytes_per_s, as Brigade's backend
// joins them (hardware.h: hierarchical_nodes): the node step on the staged
// shm path, the leaders' ring over the link, TCP's cost to the cores from
// the Gloo all-reduce measured between two local workers.
void add_links(Hardware& h, const nlohmann::json& calibration, const ThisMachineNodes& nodes) {
  const nlohmann::json& comm = field(calibration, "comm", "the file");
  for (const char* key : {"gloo_all_reduce", "staged_all_reduce"}) {
    if (!comm.contains(key)) {
      throw_error(
          "calibration: no comm.{} figures, which --nodes needs for the links between nodes and "
          "the node step; rerun `brigade bench calibrate` (without --comm-from)",
          key);
    }
  }
  if (!(nodes.link_bytes_per_s > 0)) throw_error("--nodes {} needs --link RATE", nodes.nodes);
  const RingFigures gloo = all_reduce_figures(comm, "gloo_all_reduce");
  const RingFigures staged = all_reduce_figures(comm, "staged_all_reduce");
  // On the wire a full TCP segment carries 1448 bytes of data (timestamps
  // on) in a 1514-byte Ethernet frame, which is what tc's rate counts.
  constexpr double kTcpPayloadShare = 1448.0 / 1514.0;
  h.inter_bytes_per_s = nodes.link_bytes_per_s * kTcpPayloadShare;
  h.inter_efficiency = 1.0;
  h.inter_latency_s = gloo.hop_latency_s;
  h.tcp_cpu_bytes_per_s = gloo.bus_bytes_per_s;
  // Every node's members run their node step at once: on namespace nodes,
  // all the machine's workers (hardware.h: cpu_comm_share).
  h.node_bytes_per_s = staged.bus_bytes_per_s * cpu_comm_share(h, h.machine_workers);
  h.node_latency_s = staged.hop_latency_s;
  h.hierarchical_nodes = true;
}

}  // namespace

double parse_link_rate(const std::string& rate) {
  // tc's units: bits per second (bit, kbit, mbit, gbit, tbit) or bytes per
  // second (bps, kbps, mbps, gbps, tbps); the longest suffix that matches.
  static const std::pair<const char*, double> kUnits[] = {
      {"tbit", 1e12 / 8}, {"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"tbps", 1e12},
      {"gbps", 1e9},      {"mbps", 1e6},     {"kbps", 1e3},     {"bit", 1.0 / 8},  {"bps", 1.0}};
  std::string lower;
  for (char ch : rate) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const auto& [unit, bytes] : kUnits) {
    const size_t length = std::strlen(unit);
    if (lower.size() <= length || lower.compare(lower.size() - length, length, unit) != 0) {
      continue;
    }
    const std::string number = lower.substr(0, lower.size() - length);
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end == number.c_str() + number.size() && value > 0 && std::isfinite(value)) {
      return value * bytes;
    }
    break;
  }
  throw_error(
      "--link {}: expected a rate as tc writes it, e.g. 10gbit, 800mbit or 1gbps (bytes per "
      "second)",
      rate);
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("BRIGADE_CALIBRATION"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return std::string(x) + "/brigade/this-machine.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/brigade/this-machine.json";
}

Hardware this_machine_hardware(const nlohmann::json& calibration, int64_t devices_per_node,
                               int64_t threads_per_device, const ThisMachineNodes& nodes) {
  const int64_t cores = static_cast<int64_t>(positive(calibration, "cores", "the file"));
  const int64_t devices = std::max<int64_t>(1, devices_per_node);
  // The workers that share this machine's chip.
  const int64_t machine_devices = nodes.one_machine ? devices * nodes.nodes : devices;
  const int64_t threads =
      threads_per_device > 0 ? threads_per_device : std::max<int64_t>(1, cores / devices);
  const nlohmann::json& c = compute_for(calibration, threads);
  const double measured_threads = positive(c, "threads", "compute");
  const double scale = static_cast<double>(threads) / measured_threads;
  // Devices run at once and share the chip (clocks, L3, memory): a worker
  // gets no more than its share of what every core achieves together, and
  // oversubscribed cores (namespace nodes) give each worker cores/workers.
  const nlohmann::json& all = compute_for(calibration, cores);
  const double share = std::min(static_cast<double>(threads),
                                static_cast<double>(cores) / static_cast<double>(machine_devices)) /
                       positive(all, "threads", "compute");
  Hardware h;
  h.name = "this-machine";
  h.cores = cores;
  h.gpus_per_node = static_cast<int>(nodes.nodes > 1 ? devices : cores);
  // The GEMM curve: efficiency against the best measured rate, by FLOPs per call.
  const nlohmann::json& gemm = field(c, "gemm", "compute");
  const double best_gflops = best_gemm_gflops(c);
  const double best_all_cores_gflops = best_gemm_gflops(all);
  if (best_gflops <= 0 || best_all_cores_gflops <= 0) {
    throw_error("calibration: the GEMM curve is empty; rerun `brigade bench calibrate`");
  }
  for (const nlohmann::json& point : gemm) {
    h.gemm_curve.emplace_back(point.at(0).get<double>(), point.at(1).get<double>() / best_gflops);
  }
  // The peak is the machine's (what MFU is against, as in `brigade train`);
  // GEMMs run at the measured share of it, so step times follow the
  // measured GEMM rate whatever the peak.
  h.peak_flops = std::min(peak_gflops(c) * scale, peak_gflops(all) * share) * 1e9;
  const double gemm_gflops = std::min(best_gflops * scale, best_all_cores_gflops * share);
  h.gemm_efficiency = gemm_gflops * 1e9 / h.peak_flops;
  if (h.gemm_efficiency > 1.0) {
    throw_error(
        "calibration: GEMMs at {:.0f} GFLOP/s beat the recorded peak of {:.0f}; rerun `brigade "
        "bench calibrate`",
        gemm_gflops, h.peak_flops * 1e-9);
  }
  const double attention_gflops = std::min(positive(c, "attention_gflops", "compute") * scale,
                                           positive(all, "attention_gflops", "compute") * share);
  h.attention_efficiency = attention_gflops * 1e9 / h.peak_flops;
  h.memory_bytes_per_s = std::min(positive(c, "stream_bytes_per_s", "compute") * scale,
                                  positive(all, "stream_bytes_per_s", "compute") * share);
  // Each worker owns its share of the last-level cache.
  h.cache_bytes = field(calibration, "cache_bytes", "the file").get<double>() /
                  static_cast<double>(machine_devices);
  h.cache_bytes_per_s = std::min(positive(c, "cache_stream_bytes_per_s", "compute") * scale,
                                 positive(all, "cache_stream_bytes_per_s", "compute") * share);
  // Page faults are the kernel's work on the faulting worker's core,
  // measured with one writer on an otherwise idle machine (a core to
  // itself). Every worker faults its pages back at the same point of the
  // step (ZeRO's fresh copy of a bucket, its released shards): when the
  // machine's workers outnumber its cores (namespace nodes) they share
  // them as the compute does.
  h.refault_bytes_per_s =
      positive(c, "refault_bytes_per_s", "compute") * core_per_worker(cores, machine_devices);
  // Calibrations before it was measured (2026-12-04) leave the term out.
  if (c.contains("peer_refault_bytes_per_s")) {
    h.peer_refault_bytes_per_s = positive(c, "peer_refault_bytes_per_s", "compute") *
                                 core_per_worker(cores, machine_devices);
  }
  h.optimizer_params_per_s = std::min(positive(c, "adamw_params_per_s", "compute") * scale,
                                      positive(all, "adamw_params_per_s", "compute") * share);
  h.memory_efficiency = 1.0;
  h.kernel_overhead_s = positive(c, "kernel_overhead_s", "compute");
  h.memory_bytes =
      positive(calibration, "memory_bytes", "the file") / static_cast<double>(machine_devices);
  h.reserved_bytes = 0.2e9;
  h.host_copy_bytes_per_s = h.memory_bytes_per_s;

  // The comm figures were each taken by comm.nproc workers side by side;
  // the job puts machine_devices on these cores, and a collective's copies
  // and sums are CPU work that shares them as the compute does.
  const nlohmann::json& comm = field(calibration, "comm", "the file");
  h.machine_workers = machine_devices;
  h.comm_calibration_workers = static_cast<int64_t>(positive(comm, "nproc", "comm"));
  // The shm all-reduce between two workers (the intra-node links), every
  // worker of the machine running its group's at once.
  const RingFigures shm = all_reduce_figures(comm, "all_reduce");
  const double bus = shm.bus_bytes_per_s * cpu_comm_share(h, h.machine_workers);
  h.intra_bytes_per_s = h.inter_bytes_per_s = bus;
  h.intra_efficiency = h.inter_efficiency = 1.0;
  h.intra_latency_s = h.inter_latency_s = shm.hop_latency_s;
  if (nodes.nodes > 1) add_links(h, calibration, nodes);
  // Each collective rate as calibrated, and where the job's workers share
  // the cores differently, as they get it.
  auto rate = [](double calibrated, double share) {
    return share == 1.0
               ? fmt::format("{:.2f} GB/s", calibrated * 1e-9)
               : fmt::format("{:.2f} -> {:.2f} GB/s", calibrated * 1e-9, calibrated * share * 1e-9);
  };
  const double every = cpu_comm_share(h, h.machine_workers);
  h.description = fmt::format(
      "this machine ({} cores; one device = one worker with {} thread(s)): peak {:.0f} GFLOP/s, "
      "GEMMs up to {:.0f} GFLOP/s ({:.0f}% of it), {:.1f} GB/s memory, shm all-reduce {} + {:.0f} "
      "us",
      cores, threads, h.peak_flops * 1e-9, gemm_gflops, 100.0 * h.gemm_efficiency,
      h.memory_bytes_per_s * 1e-9, rate(shm.bus_bytes_per_s, every), h.intra_latency_s * 1e6);
  if (every != 1.0) {
    h.description += fmt::format(
        " ({} workers at once on {} cores, {:.2f} of a core each; the calibration's {} had {:.2f})",
        h.machine_workers, cores, core_per_worker(cores, h.machine_workers),
        h.comm_calibration_workers, core_per_worker(cores, h.comm_calibration_workers));
  }
  if (h.hierarchical_nodes) {
    // The world's leaders run TCP at once: one per node, all of them on
    // this machine with namespace nodes. A smaller group's flat ring puts
    // every worker on TCP (cost_model.cc: cpu_nodes_dp).
    const int64_t leaders = nodes.one_machine ? nodes.nodes : 1;
    const double leader_share = cpu_comm_share(h, leaders);
    h.description += fmt::format(
        "; {} {}nodes of {} worker(s): links {:.2f} GB/s of payload, TCP (Gloo) {} + {:.0f} us "
        "({} on {} cores",
        nodes.nodes, nodes.one_machine ? "namespace " : "", devices, h.inter_bytes_per_s * 1e-9,
        rate(h.tcp_cpu_bytes_per_s, leader_share), h.inter_latency_s * 1e6,
        nodes.one_machine ? fmt::format("{} leaders", leaders) : std::string("a leader"), cores);
    if (every != leader_share) {
      h.description += fmt::format("; every worker, in a group smaller than the world: {}",
                                   rate(h.tcp_cpu_bytes_per_s, every));
    }
    h.description +=
        fmt::format("), the node step (staged shm) {}",
                    rate(all_reduce_figures(comm, "staged_all_reduce").bus_bytes_per_s, every));
  }
  return h;
}

std::string describe_calibration(const nlohmann::json& calibration) {
  std::string out;
  for (const nlohmann::json& c : calibration.at("compute")) {
    const double best = best_gemm_gflops(c);
    if (c.contains("peak_description")) {
      out += fmt::format("{} thread(s): {}\n", c.at("threads").get<int>(),
                         c.at("peak_description").get<std::string>());
    }
    out += fmt::format(
        "{} thread(s): sgemm up to {:.1f} GFLOP/s (64^3: {:.1f}), memory {:.1f} GB/s (in cache "
        "{:.1f}), AdamW {:.0f} M parameters/s, released pages back at {:.1f} GB/s, attention "
        "{:.1f} GFLOP/s, small kernel {:.1f} us\n",
        c.at("threads").get<int>(), best, c.at("gemm").front().at(1).get<double>(),
        c.at("stream_bytes_per_s").get<double>() * 1e-9,
        c.at("cache_stream_bytes_per_s").get<double>() * 1e-9,
        c.at("adamw_params_per_s").get<double>() * 1e-6,
        c.at("refault_bytes_per_s").get<double>() * 1e-9, c.at("attention_gflops").get<double>(),
        c.at("kernel_overhead_s").get<double>() * 1e6);
    if (c.contains("peer_refault_bytes_per_s")) {
      out += fmt::format("{} thread(s): a peer's view of released pages back at {:.1f} GB/s\n",
                         c.at("threads").get<int>(),
                         c.at("peer_refault_bytes_per_s").get<double>() * 1e-9);
    }
  }
  for (const auto& [key, what] : {std::pair<const char*, const char*>{"all_reduce", "shm"},
                                  std::pair<const char*, const char*>{"gloo_all_reduce", "Gloo"}}) {
    if (!calibration.at("comm").contains(key)) continue;
    for (const nlohmann::json& r : calibration.at("comm").at(key)) {
      out += fmt::format("{} all-reduce, 2 workers, {} bytes: {:.1f} us\n", what,
                         r.at("bytes").get<int64_t>(), r.at("time_s").get<double>() * 1e6);
    }
  }
  return out;
}

SystemFeatures brigade_cpu_features() {
  SystemFeatures f;
  f.flash_attention = true;
  f.attention_dropout = false;
  // Brigade does overlap its buckets with backward, but on a CPU the
  // reductions run on the same cores that compute: with every core busy a
  // collective's time is added to the step, not hidden.
  f.overlap_dp = false;
  f.act_bytes = 4;
  f.param_bytes = 4;
  f.grad_bytes = 4;
  f.optimizer_bytes = 8;
  // AdamW itself is timed by the calibration (optimizer_params_per_s);
  // around it, clipping reads the gradient and the next step's zeroing
  // writes it.
  f.optimizer_traffic_bytes = 8;
  f.dp_bucket_bytes = 25e6;
  return f;
}

}  // namespace brigade::sim

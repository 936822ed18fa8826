// brigade bench calibrate [--out FILE]
// Measures what the planner needs to treat this machine as hardware
// (`brigade plan --hardware this-machine`): the machine's peak (the FMA peak
// MFU is against, kernels/cpu/fma_peak.h), sgemm throughput across sizes (the
// GEMM efficiency curve) with one thread and with every core, streaming memory
// bandwidth, the rate of our attention kernel, the fixed cost of a small
// kernel, and the shm all-reduce's bus bandwidth and latency between two
// workers (`bench comm --shared`, the zero-copy path training uses), of
// the staged shm path and of Gloo over loopback TCP (the hierarchical
// backend's node step and leaders, for `plan --nodes`), the AdamW rate, and what ZeRO's released
// pages cost when they come back. Writes one JSON file (sim/this_machine.h reads it); takes about a
// minute, less with --comm-from (the all-reduce figures of an earlier run).
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/core/aligned_buffer.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/pages.h"
#include "brigade/core/signals.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/attention.h"
#include "brigade/kernels/cpu/fma_peak.h"
#include "brigade/kernels/cpu/gelu.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa.h"
#include "brigade/kernels/cpu/vector_ops.h"
#include "brigade/sim/this_machine.h"

namespace brigade::cli {
namespace {

// Best time of `fn` over repetitions filling about `budget_s` (at least 3).
template <typename Fn>
double best_seconds(Fn&& fn, double budget_s = 0.15) {
  fn();  // warm caches, pages and the thread pool
  double best = 1e30;
  Stopwatch total;
  for (int rep = 0; rep < 3 || (total.elapsed_s() < budget_s && rep < 10000); ++rep) {
    Stopwatch sw;
    fn();
    best = std::min(best, sw.elapsed_s());
  }
  return best;
}

void fill(FloatBuffer& b) {
  for (int64_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<float>(i % 13) * 0.01f;
}

// (FLOPs per call, GFLOP/s) for square GEMMs from 64 to 1536. Training's
// GEMMs find their operands in L3 or DRAM (other kernels ran in between), so
// each size cycles through enough operand sets to fill 64 MiB (twice this
// machine's L3): a small GEMM measured on hot caches would promise 15% more
// than training sees.
nlohmann::json gemm_curve() {
  nlohmann::json curve = nlohmann::json::array();
  for (int n : {64, 128, 192, 256, 384, 512, 768, 1024, 1536}) {
    const int64_t elements = int64_t{n} * n;
    const int sets =
        static_cast<int>(std::clamp<int64_t>((int64_t{64} << 20) / (3 * 4 * elements), 1, 4096));
    std::vector<FloatBuffer> a, b, c;
    for (int i = 0; i < sets; ++i) {
      a.emplace_back(elements);
      b.emplace_back(elements);
      c.emplace_back(elements);
      fill(a.back());
      fill(b.back());
    }
    int next = 0;
    const int calls = std::max(sets, 3);
    const double s = best_seconds(
        [&] {
          for (int call = 0; call < calls; ++call, next = (next + 1) % sets) {
            cpu::gemm(false, false, n, n, n, 1.0f, a[next].data(), n, b[next].data(), n, 0.0f,
                      c[next].data(), n);
          }
        },
        0.1);
    const double flops = 2.0 * n * n * static_cast<double>(n);
    curve.push_back({flops, flops * calls / s * 1e-9});
  }
  return curve;
}

// Bytes per second of y += a * x (read 2, write 1) over vectors that
// together occupy `working_set_bytes`.
double stream_bytes_per_s(int64_t working_set_bytes) {
  const int64_t n = working_set_bytes / 8;
  FloatBuffer x(n), y(n);
  fill(x);
  fill(y);
  float* yp = y.data();
  const float* xp = x.data();
  const double s = best_seconds(
      [&] {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) yp[i] += 0.5f * xp[i];
      },
      0.3);
  return 3.0 * 4.0 * static_cast<double>(n) / s;
}

// Parameters per second of the AdamW update over 16M parameters (256 MiB of
// state, as large models have): on CPUs its square roots and divisions, not
// the memory, can be the limit.
double adamw_params_per_s() {
  const int64_t n = int64_t{16} << 20;
  FloatBuffer p(n), g(n), m(n), v(n);
  fill(p);
  fill(g);
  int64_t step = 0;
  const double s = best_seconds(
      [&] {
        cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                          {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, 1.0f}, {});
      },
      0.3);
  return static_cast<double>(n) / s;
}

// Released pages coming back, the two costs ZeRO 2 and 3 pay for releasing
// the shards a rank does not own (core/pages.h), over and above the copies.
struct Refault {
  // The owner writing them again: the release, taking the pages back in one
  // call (as the gathers and the gradient buckets do) and the zeroing.
  double bytes_per_s = 0;
  // A peer reading them in place afterwards: the release unmapped them from
  // every process, so the peer's reads fault each page into its own view
  // (the reduce-scatter reads the peers' gradient shards where they lie);
  // 0 if that costs nothing measurable.
  double peer_bytes_per_s = 0;
};

// Measured on a shared mapping, like training's flat buffers in the shm
// segment, mapped twice: the second view is the peer's.
Refault measure_refault() {
  const size_t bytes = size_t{64} << 20;
  const int fd = ::memfd_create("brigade-calibrate", 0);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) ::close(fd);
    throw_error("calibration: cannot create 64 MiB of shared memory: {}", std::strerror(errno));
  }
  void* own = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* peer = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (own == MAP_FAILED || peer == MAP_FAILED) {
    const int error = errno;
    if (own != MAP_FAILED) ::munmap(own, bytes);
    if (peer != MAP_FAILED) ::munmap(peer, bytes);
    throw_error("calibration: cannot map 64 MiB of shared memory twice: {}", std::strerror(error));
  }
  float* begin = static_cast<float*>(own);
  float* end = begin + bytes / sizeof(float);
  const auto* seen = static_cast<const float*>(peer);
  volatile float sink = 0;
  auto read_peer = [&] {
    float sum = 0;
    for (size_t i = 0; i < bytes / sizeof(float); i += 16) sum += seen[i];
    sink = sum;
  };
  std::memset(own, 1, bytes);
  read_peer();
  const double write_s = best_seconds([&] { std::memset(own, 1, bytes); });
  // What ZeRO 2/3 do to a released shard each step: give it back, take it
  // back in one call, write it again.
  auto rewrite = [&] {
    release_as_zeros(begin, end, /*shared=*/true);
    populate_for_write(begin, end);
    std::memset(own, 1, bytes);
  };
  const double refault_s = best_seconds(rewrite);
  const double read_s = best_seconds(read_peer);
  // The peer's first reads after a rewrite, timed alone (the rewrite is
  // hundreds of milliseconds, its drift larger than what is measured here).
  double remap_s = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    rewrite();
    Stopwatch sw;
    read_peer();
    remap_s = std::min(remap_s, sw.elapsed_s());
  }
  (void)sink;
  ::munmap(own, bytes);
  ::munmap(peer, bytes);
  const double b = static_cast<double>(bytes);
  // Within 5% of a plain read: nothing to charge (the key is then left out).
  const double remap_extra_s = remap_s - read_s;
  return {b / std::max(refault_s - write_s, 1e-9),
          remap_extra_s > 0.05 * read_s ? b / remap_extra_s : 0.0};
}

// The last-level cache, from sysfs (0 if the kernel does not say).
double l3_bytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  double size = 0;
  std::string unit;
  if (!(in >> size)) return 0;
  in >> unit;
  if (!unit.empty() && (unit[0] == 'K' || unit[0] == 'k')) size *= 1024;
  if (!unit.empty() && (unit[0] == 'M' || unit[0] == 'm')) size *= 1024 * 1024;
  return size;
}

// GFLOP/s of attention forward + backward, counting what the planner counts
// for fused causal attention: half of 4 b s^2 h forward, 2.5x that backward.
double attention_gflops() {
  const int64_t b = 4, t = 256, c = 768, heads = 12;
  FloatBuffer qkv(b * t * 3 * c), out(b * t * c), lse(b * heads * t), dout(b * t * c),
      dqkv(b * t * 3 * c);
  fill(qkv);
  fill(dout);
  const double s = best_seconds([&] {
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), b, t, c, heads);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), b, t, c,
                            heads);
  });
  const double fwd_flops = 0.5 * 4.0 * b * static_cast<double>(t * t * c);
  return 3.5 * fwd_flops / s * 1e-9;
}

// Time of one tiny parallel kernel: the floor every small op pays.
double kernel_overhead_s() {
  FloatBuffer x(256), y(256);
  fill(x);
  Stopwatch sw;
  const int reps = 20000;
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    sw.reset();
    for (int i = 0; i < reps; ++i) cpu::gelu_forward(y.data(), x.data(), 256);
    best = std::min(best, sw.elapsed_s() / reps);
  }
  return best;
}

nlohmann::json measure_threads(int threads) {
  set_num_threads(threads);
  nlohmann::json gemm = gemm_curve();
  double best_gemm_gflops = 0;
  for (const nlohmann::json& point : gemm) {
    best_gemm_gflops = std::max(best_gemm_gflops, point.at(1).get<double>());
  }
  // The peak MFU is against (as `brigade train` takes it): the planner's
  // MFU then means what the runs' does.
  const cpu::MachinePeak peak = cpu::machine_peak(threads, best_gemm_gflops);
  const Refault refault = measure_refault();
  nlohmann::json out = {
      {"threads", threads},
      {"peak_gflops", peak.gflops},
      {"peak_source", peak.source},
      {"peak_description", peak.description},
      {"fma_peak",
       {{"threads", peak.fma.threads},
        {"fma_units", peak.fma.fma_units},
        {"lanes", peak.fma.lanes},
        {"clock_ghz", peak.fma.clock_ghz},
        {"gflops", peak.fma.gflops}}},
      {"gemm", std::move(gemm)},
      // Activations of one kernel fit the cache; weights and optimizer state do not.
      {"cache_stream_bytes_per_s", stream_bytes_per_s(int64_t{8} << 20)},
      {"stream_bytes_per_s", stream_bytes_per_s(int64_t{768} << 20)},
      {"adamw_params_per_s", adamw_params_per_s()},
      {"refault_bytes_per_s", refault.bytes_per_s},
      {"attention_gflops", attention_gflops()},
      {"kernel_overhead_s", kernel_overhead_s()}};
  if (refault.peer_bytes_per_s > 0) out["peer_refault_bytes_per_s"] = refault.peer_bytes_per_s;
  return out;
}

// The all-reduce rows of `bench comm ... --json` for 2 local workers.
nlohmann::json all_reduce_rows(const std::string& backend_flags, const std::string& max_bytes) {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) throw_error("cannot find the brigade binary (/proc/self/exe)");
  self[len] = '\0';
  const std::string command = fmt::format(
      "'{}' bench comm --nproc 2 {} --ops all_reduce --min-bytes 4K --max-bytes {} --json", self,
      backend_flags, max_bytes);
  FILE* pipe = nullptr;
  {
    const StartupMaskForChildren child_mask;
    pipe = ::popen(command.c_str(), "r");
  }
  if (pipe == nullptr) throw_error("cannot run {}", command);
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  if (::pclose(pipe) != 0) throw_error("{} failed: calibration needs 2 local workers", command);
  nlohmann::json rows = nlohmann::json::array();
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = output.find('\n', start);
    const std::string line = output.substr(start, end - start);
    start = end == std::string::npos ? output.size() : end + 1;
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.at("op") == "all_reduce") {
      rows.push_back(
          {{"bytes", row.at("bytes")}, {"time_s", row.at("time_us").get<double>() * 1e-6}});
    }
  }
  if (rows.empty()) throw_error("{} printed no all_reduce rows", command);
  return rows;
}

// The shm all-reduce training uses inside a node (the zero-copy path); for
// `brigade plan --nodes`, the staged shm path (the hierarchical backend's
// node step) and Gloo over loopback TCP (what a node leader's collectives
// cost the cores before any wire limits them). A failure of the last two
// leaves them out with a warning: plans of one node do not need them, and
// plan --nodes says what is missing.
nlohmann::json measure_comm() {
  nlohmann::json comm = {{"nproc", 2},
                         {"all_reduce", all_reduce_rows("--backend shm --shared", "64M")}};
  for (const auto& [key, flags] :
       {std::pair<const char*, const char*>{"staged_all_reduce", "--backend shm"},
        std::pair<const char*, const char*>{"gloo_all_reduce", "--backend gloo"}}) {
    try {
      comm[key] = all_reduce_rows(flags, "64M");
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "brigade bench calibrate: warning: no %s figures (%s); `brigade plan --nodes` "
                   "will ask for them\n",
                   key, e.what());
    }
  }
  return comm;
}

}  // namespace

nlohmann::json measure_this_machine(const nlohmann::json* comm) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nlohmann::json out;
  out["version"] = 2;  // 2: the machine's peak (compute[].peak_gflops)
  out["cpu"] = cpu::describe_cpu();
  out["gemm_backend"] = cpu::gemm_backend();
  out["cores"] = cores;
  out["cache_bytes"] = l3_bytes();
  out["memory_bytes"] = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  nlohmann::json per_threads = nlohmann::json::array();
  per_threads.push_back(measure_threads(1));
  if (cores > 1) per_threads.push_back(measure_threads(cores));
  set_num_threads(0);
  out["compute"] = per_threads;
  out["comm"] = comm != nullptr ? *comm : measure_comm();
  return out;
}

void add_bench_calibrate_command(CLI::App& bench) {
  auto out = std::make_shared<std::string>(sim::default_calibration_path());
  auto* cmd = bench.add_subcommand(
      "calibrate", "Measure this machine for `brigade plan --hardware this-machine`");
  cmd->add_option("--out", *out, "Where to write the calibration")->capture_default_str();
  auto comm_from = std::make_shared<std::string>();
  cmd->add_option("--comm-from", *comm_from,
                  "Take the all-reduce figures from this earlier calibration instead of "
                  "measuring them again (the compute figures alone take a few seconds)")
      ->check(CLI::ExistingFile);
  cmd->callback([out, comm_from] {
    nlohmann::json earlier;
    if (!comm_from->empty()) {
      try {
        earlier = nlohmann::json::parse(read_file(*comm_from)).at("comm");
      } catch (const nlohmann::json::exception& e) {
        throw_error("--comm-from {}: no all-reduce figures in it ({})", *comm_from, e.what());
      }
    }
    const nlohmann::json calibration =
        measure_this_machine(comm_from->empty() ? nullptr : &earlier);
    sim::this_machine_hardware(calibration, 1);  // refuse to write what cannot be read back
    std::filesystem::create_directories(std::filesystem::path(*out).parent_path());
    write_file_atomic(*out, calibration.dump(2) + "\n");
    std::printf("%s\n", sim::describe_calibration(calibration).c_str());
    std::printf("wrote %s\n", out->c_str());
  });
}

}  // namespace brigade::cli

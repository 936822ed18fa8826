// brigade bench comm --nproc N --backend shm|gloo|hierarchical [--min-bytes 4K] [--max-bytes 256M]
//                    [--iters auto|N] [--ops all_reduce,...] [--json]
//                    [--nnodes M --node-rank R --rdzv HOST:PORT [--rdzv-token T]]
// What the links between this node's workers deliver: time per operation,
// algorithm bandwidth and bus bandwidth (nccl-tests' definitions) of
// all-reduce, reduce-scatter, all-gather, broadcast and send/recv (each rank
// sends to the next and receives from the previous at once), for sizes from
// --min-bytes to --max-bytes in powers of 4. bench/compare_comm.py runs it
// beside OpenMPI's MPI_Allreduce (bench/mpi_allreduce_peer.c) and Gloo.
//
// The command re-launches this binary under the launcher as N `bench
// comm-worker` processes (hidden), so the numbers include exactly what a
// training job's collectives pay: the backend's communication thread, its
// synchronisation and its copies. With --nnodes it runs on several nodes as
// `brigade launch` does (each node starts its --nproc workers): the
// hierarchical backend against flat Gloo across real links
// (bench/multi_node_comm.py runs it on scripts/fake_cluster.sh's nodes).
//
// Network bytes: around each timed loop, local rank 0 of every node reads
// its network namespace's transmit counters (/proc/self/net/dev, every
// interface but loopback) and the sum over nodes, divided by the operations,
// is reported as net_tx_bytes per operation: what the operation put on the
// wire between nodes, TCP/IP headers and ACKs included. Anything else the
// node sends meanwhile counts too; shared memory and loopback never do.
//
// Sizes follow nccl-tests: "bytes" is the larger buffer of the operation (the
// all-reduce buffer, reduce-scatter's input, all-gather's output), so algbw =
// bytes / time, and busbw = algbw * factor, where the factor turns every
// operation into the bandwidth a ring would need on each link:
//   all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast
//   and send/recv 1.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/cli/launcher.h"
#include "brigade/comm/communicator.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/comm/world.h"
#include "brigade/core/error.h"

namespace brigade::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Each timed measurement aims for this much wall time per (size, op): long
// enough to average out scheduler noise on a shared machine, short enough
// that the default sweep of 9 sizes x 4 ops stays well under two minutes.
constexpr double kTargetSeconds = 0.2;
// The calibration round before it: long enough that the per-op estimate of a
// 4 KiB operation (microseconds) is not one timer tick.
constexpr double kCalibrationSeconds = 0.02;
constexpr int64_t kMaxIters = 1'000'000;
constexpr int kWarmupIters = 2;

struct BenchCommArgs {
  int nproc = 2;
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv;
  std::string rdzv_token;
  std::string ops = "all";
  std::string backend = "shm";
  std::string min_bytes = "4K";
  std::string max_bytes = "256M";
  std::string iters = "auto";
  bool json = false;
  bool shared = false;
  int64_t timeout_s = 120;
};

// The worker's arguments: sizes already parsed and checked by the parent.
struct BenchCommWorkerArgs {
  std::string backend = "shm";
  std::string ops = "all";
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 256 << 20;
  int64_t iters = 0;  // 0: auto
  bool json = false;
  bool shared = false;
  int64_t timeout_s = 120;
};

// "4096", "4K", "64KiB", "256M", "1G" -> bytes (binary multiples).
int64_t parse_bytes(const std::string& text, const char* option) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && (suffix.ends_with("IB") || suffix.ends_with("B"))) {
    suffix = suffix.substr(0, suffix.ends_with("IB") ? suffix.size() - 2 : suffix.size() - 1);
  }
  int shift = -1;
  if (suffix.empty() || suffix == "B") shift = 0;
  if (suffix == "K") shift = 10;
  if (suffix == "M") shift = 20;
  if (suffix == "G") shift = 30;
  if (digits == 0 || digits > 12 || shift < 0) {
    throw_error("{} '{}' is not a size: write bytes with an optional K, M or G (4K, 256M)", option,
                text);
  }
  return std::stoll(text.substr(0, digits)) << shift;
}

std::string format_bytes(int64_t bytes) {
  if (bytes >= (1 << 30) && bytes % (1 << 30) == 0) return fmt::format("{}G", bytes >> 30);
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

enum class Op { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSendRecv };
constexpr Op kOps[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather, Op::kBroadcast,
                       Op::kSendRecv};

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllGather:
      return "all_gather";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kSendRecv:
      return "send_recv";
  }
  return "?";
}

// "all" or a comma-separated list of op names -> the ops, in kOps' order.
std::vector<Op> parse_ops(const std::string& text) {
  if (text == "all") return {std::begin(kOps), std::end(kOps)};
  std::vector<std::string> names;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    names.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  std::vector<Op> ops;
  for (const Op op : kOps) {
    if (std::find(names.begin(), names.end(), op_name(op)) != names.end()) ops.push_back(op);
  }
  for (const std::string& name : names) {
    bool known = false;
    for (const Op op : kOps) known = known || name == op_name(op);
    if (!known) {
      throw_error(
          "--ops '{}': '{}' is not an operation; use all, or a comma-separated list of "
          "all_reduce, reduce_scatter, all_gather, broadcast, send_recv",
          text, name);
    }
  }
  return ops;
}

// Bytes this network namespace has transmitted, by interface (loopback
// left out); empty if /proc/self/net/dev cannot be read.
std::map<std::string, int64_t> network_tx_bytes() {
  std::map<std::string, int64_t> sent;
  std::FILE* file = std::fopen("/proc/self/net/dev", "r");
  if (file == nullptr) return sent;
  char line[512];
  int line_number = 0;
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    if (++line_number <= 2) continue;  // two header lines
    char* colon = std::strchr(line, ':');
    if (colon == nullptr) continue;
    *colon = '\0';
    const char* name = line + std::strspn(line, " ");
    if (std::strcmp(name, "lo") == 0) continue;
    // receive: bytes packets errs drop fifo frame compressed multicast; then transmit bytes
    unsigned long long fields[9] = {};
    if (std::sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &fields[0],
                    &fields[1], &fields[2], &fields[3], &fields[4], &fields[5], &fields[6],
                    &fields[7], &fields[8]) == 9) {
      sent[name] = static_cast<int64_t>(fields[8]);
    }
  }
  std::fclose(file);
  return sent;
}

// What the interfaces present at both readings sent in between: one made
// or removed meanwhile (another program's veth pair) is not this run's.
int64_t tx_bytes_between(const std::map<std::string, int64_t>& before,
                         const std::map<std::string, int64_t>& after) {
  int64_t total = 0;
  for (const auto& [name, bytes] : after) {
    const auto it = before.find(name);
    if (it != before.end() && bytes >= it->second) total += bytes - it->second;
  }
  return total;
}

// nccl-tests' bus-bandwidth factor for a group of n ranks.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kReduceScatter:
    case Op::kAllGather:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
    case Op::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

// The buffers of one size, f32 elements. `big` holds the larger buffer
// (all-reduce data, reduce-scatter input, all-gather output); `small` holds
// one rank's share (reduce-scatter output, all-gather input).
// Both live either in this process's heap or, with --shared, in the shm
// segment's peer-visible region (the zero-copy path training's flat buffers take).
struct Buffers {
  float* big = nullptr;         // [total_count]
  float* small = nullptr;       // [share_count]
  int64_t total_count = 0;      // all-reduce and broadcast count
  int64_t share_count = 0;      // per-rank count of reduce-scatter and all-gather
  std::vector<float> owned;     // the heap behind big and small, when not shared
  std::vector<float> received;  // send/recv's destination [total_count], always private
};

// The elements an operation moves, and the bytes it reports (nccl-tests: the
// larger buffer). A size that does not divide by the group rounds the share
// down, and the reported bytes with it.
int64_t op_bytes(Op op, const Buffers& buffers, int group_size) {
  if (op == Op::kReduceScatter || op == Op::kAllGather) {
    return buffers.share_count * group_size * static_cast<int64_t>(sizeof(float));
  }
  return buffers.total_count * static_cast<int64_t>(sizeof(float));
}

std::shared_ptr<Work> issue(Communicator& comm, Op op, Buffers& buffers) {
  switch (op) {
    case Op::kAllReduce:
      return comm.all_reduce(buffers.big, buffers.total_count, DType::kF32, ReduceOp::kSum);
    case Op::kReduceScatter:
      return comm.reduce_scatter(buffers.big, buffers.small, buffers.share_count, DType::kF32,
                                 ReduceOp::kSum);
    case Op::kAllGather:
      return comm.all_gather(buffers.small, buffers.big, buffers.share_count, DType::kF32);
    case Op::kBroadcast:
      return comm.broadcast(buffers.big, buffers.total_count, DType::kF32, /*root=*/0);
    case Op::kSendRecv: {
      const int next = (comm.rank() + 1) % comm.size();
      const int prev = (comm.rank() + comm.size() - 1) % comm.size();
      auto sent = comm.send(buffers.big, buffers.total_count, DType::kF32, next, 0);
      auto received = comm.recv(buffers.received.data(), buffers.total_count, DType::kF32, prev, 0);
      sent->wait();
      return received;
    }
  }
  BRIGADE_CHECK(false, "unknown op");
  return nullptr;  // not reached: at -O0 (the sanitizer trees) GCC cannot see that
}

double all_reduce_max(Communicator& comm, double value) {
  comm.all_reduce(&value, 1, DType::kF64, ReduceOp::kMax)->wait();
  return value;
}

// Small integers in every pattern below, so every sum is exact in f32 and a
// wrong element cannot hide behind rounding.
float pattern(int64_t i, int64_t period) {
  return static_cast<float>(i % period + 1);
}

// Fills the inputs with rank-dependent values, runs the operation once and
// compares every output element with what it must be. Returns the first
// mismatch as a message, or "" when all is right.
std::string check_op(Communicator& comm, Op op, Buffers& buffers) {
  const int n = comm.size();
  const int rank = comm.rank();
  const int64_t total = buffers.total_count;
  const int64_t share = buffers.share_count;
  switch (op) {
    case Op::kAllReduce:
      // rank r holds (r+1) * p(i); the sum is n(n+1)/2 * p(i).
      for (int64_t i = 0; i < total; ++i)
        buffers.big[i] = static_cast<float>(rank + 1) * pattern(i, 7);
      break;
    case Op::kReduceScatter:
      // rank r's segment s holds (s+1)*(r+1) + p(j); segment r sums to
      // (r+1) * n(n+1)/2 + n * p(j).
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t j = 0; j < share; ++j) {
          buffers.big[s * share + j] = static_cast<float>((s + 1) * (rank + 1)) + pattern(j, 5);
        }
      }
      break;
    case Op::kAllGather:
      for (int64_t j = 0; j < share; ++j)
        buffers.small[j] = static_cast<float>(rank * 100) + pattern(j, 13);
      std::fill(buffers.big, buffers.big + total, -1.0f);
      break;
    case Op::kBroadcast:
      for (int64_t i = 0; i < total; ++i) buffers.big[i] = rank == 0 ? pattern(i, 11) : -1.0f;
      break;
    case Op::kSendRecv:
      for (int64_t i = 0; i < total; ++i)
        buffers.big[i] = static_cast<float>(rank + 1) * pattern(i, 7);
      std::fill(buffers.received.begin(), buffers.received.end(), -1.0f);
      break;
  }
  issue(comm, op, buffers)->wait();

  const float triangle = static_cast<float>(n * (n + 1) / 2);
  auto mismatch = [&](int64_t index, float got, float expected) {
    return fmt::format("{} of {} elements is wrong on rank {}: element {} is {}, expected {}",
                       op_name(op),
                       op == Op::kReduceScatter || op == Op::kAllGather ? share : total, rank,
                       index, got, expected);
  };
  switch (op) {
    case Op::kAllReduce:
      for (int64_t i = 0; i < total; ++i) {
        const float expected = triangle * pattern(i, 7);
        if (buffers.big[i] != expected) return mismatch(i, buffers.big[i], expected);
      }
      break;
    case Op::kReduceScatter:
      for (int64_t j = 0; j < share; ++j) {
        const float expected =
            static_cast<float>(rank + 1) * triangle + static_cast<float>(n) * pattern(j, 5);
        if (buffers.small[j] != expected) return mismatch(j, buffers.small[j], expected);
      }
      break;
    case Op::kAllGather:
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t j = 0; j < share; ++j) {
          const float expected = static_cast<float>(s * 100) + pattern(j, 13);
          if (buffers.big[s * share + j] != expected)
            return mismatch(s * share + j, buffers.big[s * share + j], expected);
        }
      }
      break;
    case Op::kBroadcast:
      for (int64_t i = 0; i < total; ++i) {
        if (buffers.big[i] != pattern(i, 11)) return mismatch(i, buffers.big[i], pattern(i, 11));
      }
      break;
    case Op::kSendRecv: {
      const int prev = (rank + n - 1) % n;
      for (int64_t i = 0; i < total; ++i) {
        const float expected = static_cast<float>(prev + 1) * pattern(i, 7);
        if (buffers.received[i] != expected) return mismatch(i, buffers.received[i], expected);
      }
      break;
    }
  }
  return "";
}

// Runs `iters` operations back to back, each waited for (the latency a caller
// that needs the result sees), and returns this rank's seconds per operation.
// With tx_bytes, also what this node's interfaces sent meanwhile, read by
// local rank 0 only (count_node), so each node counts once (0 elsewhere).
// Barriers around the counter reads keep every rank's operations inside the
// counted window; they are outside the timed one.
double time_ops(Communicator& comm, Op op, Buffers& buffers, int64_t iters,
                int64_t* tx_bytes = nullptr, bool count_node = false) {
  comm.barrier()->wait();
  std::map<std::string, int64_t> tx_before;
  if (tx_bytes != nullptr) {
    if (count_node) tx_before = network_tx_bytes();
    comm.barrier()->wait();
  }
  const auto start = Clock::now();
  for (int64_t i = 0; i < iters; ++i) issue(comm, op, buffers)->wait();
  const std::chrono::duration<double> elapsed = Clock::now() - start;
  if (tx_bytes != nullptr) {
    comm.barrier()->wait();
    *tx_bytes = count_node ? tx_bytes_between(tx_before, network_tx_bytes()) : 0;
  }
  return elapsed.count() / static_cast<double>(iters);
}

// Every rank must run the same number of operations, so each estimate is
// agreed on through an all-reduce (max: the slowest rank sets the pace).
int64_t choose_iters(Communicator& comm, Op op, Buffers& buffers) {
  const double first_s = all_reduce_max(comm, time_ops(comm, op, buffers, 1));
  const int64_t calibration_iters = std::clamp<int64_t>(
      static_cast<int64_t>(kCalibrationSeconds / std::max(first_s, 1e-9)), 1, 1000);
  const double calibrated_s = all_reduce_max(comm, time_ops(comm, op, buffers, calibration_iters));
  return std::clamp<int64_t>(static_cast<int64_t>(kTargetSeconds / std::max(calibrated_s, 1e-9)), 1,
                             kMaxIters);
}

void print_table_header(const BenchCommWorkerArgs& args, int n) {
  std::printf("brigade bench comm: backend %s, %d processes, f32 sum, %s buffers\n",
              args.backend.c_str(), n, args.shared ? "shared-segment" : "private");
  std::printf("%10s  %-15s %8s %12s %12s %12s %12s\n", "size", "op", "iters", "time us",
              "algbw GB/s", "busbw GB/s", "net B/op");
}

void run_bench_comm_worker(const BenchCommWorkerArgs& args) {
  // With --shared, room for the largest size's big and small buffers, each
  // rounded up to whole pages (the segment wants a multiple of 4096).
  const auto round_up_pages = [](int64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  const WorldEnvironment world = read_world_environment();
  const int world_size = world.world_size;
  const std::vector<Op> ops = parse_ops(args.ops);
  const int64_t shared_bytes =
      args.shared ? round_up_pages(args.max_bytes) + round_up_pages(args.max_bytes / world_size + 4)
                  : 0;
  const std::unique_ptr<Communicator> comm =
      connect_world(args.backend, args.timeout_s * 1000, shared_bytes);
  float* shared_region = nullptr;
  if (args.shared) {
    auto* shm = dynamic_cast<ShmCommunicator*>(comm.get());
    BRIGADE_CHECK(shm != nullptr, "--shared needs the shm backend");
    shared_region = static_cast<float*>(shm->shared_buffer());
    BRIGADE_CHECK(shared_region != nullptr);
  }
  const int n = comm->size();
  const bool printer = comm->rank() == 0;
  if (printer && !args.json) print_table_header(args, n);

  for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) {
    Buffers buffers;
    buffers.total_count = bytes / static_cast<int64_t>(sizeof(float));
    buffers.share_count = buffers.total_count / n;
    const int64_t small_count = std::max<int64_t>(buffers.share_count, 1);
    if (shared_region != nullptr) {
      buffers.big = shared_region;
      buffers.small = shared_region + round_up_pages(args.max_bytes) / sizeof(float);
    } else {
      buffers.owned.assign(static_cast<size_t>(buffers.total_count + small_count), 0.0f);
      buffers.big = buffers.owned.data();
      buffers.small = buffers.owned.data() + buffers.total_count;
    }
    buffers.received.assign(static_cast<size_t>(buffers.total_count), 0.0f);

    for (const Op op : ops) {
      if (op_bytes(op, buffers, n) == 0) continue;  // fewer elements than ranks
      // Correctness first, once per size; every rank learns whether any rank
      // failed, so all stop together with the message instead of hanging.
      const std::string wrong = check_op(*comm, op, buffers);
      if (all_reduce_max(*comm, wrong.empty() ? 0.0 : 1.0) != 0.0) {
        if (!wrong.empty())
          throw_error("bench comm: {} backend gave a wrong result: {}", args.backend, wrong);
        throw_error("bench comm: {} backend gave a wrong {} result on another rank (see its error)",
                    args.backend, op_name(op));
      }
      // Zeros from here on: repeated in-place sums of them stay finite.
      std::fill(buffers.big, buffers.big + buffers.total_count, 0.0f);
      for (int i = 0; i < kWarmupIters; ++i) issue(*comm, op, buffers)->wait();
      const int64_t iters = args.iters > 0 ? args.iters : choose_iters(*comm, op, buffers);
      int64_t tx_bytes = 0;
      const double time_s = all_reduce_max(
          *comm, time_ops(*comm, op, buffers, iters, &tx_bytes, world.local_rank == 0));
      double node_tx = static_cast<double>(tx_bytes);
      comm->all_reduce(&node_tx, 1, DType::kF64, ReduceOp::kSum)->wait();
      const double net_tx_per_op = node_tx / static_cast<double>(iters);

      const int64_t reported_bytes = op_bytes(op, buffers, n);
      const double algbw_gbps = static_cast<double>(reported_bytes) / time_s / 1e9;
      const double busbw_gbps = algbw_gbps * bus_factor(op, n);
      if (!printer) continue;
      if (args.json) {
        const nlohmann::json line = {{"backend", args.backend},
                                     {"nproc", n},
                                     {"op", op_name(op)},
                                     {"dtype", "f32"},
                                     {"buffers", args.shared ? "shared" : "private"},
                                     {"bytes", reported_bytes},
                                     {"iters", iters},
                                     {"time_us", time_s * 1e6},
                                     {"algbw_gbps", algbw_gbps},
                                     {"busbw_gbps", busbw_gbps},
                                     {"nnodes", world_size / world.local_world_size},
                                     {"net_tx_bytes", net_tx_per_op}};
        std::printf("%s\n", line.dump().c_str());
      } else {
        std::printf("%10s  %-15s %8lld %12.2f %12.3f %12.3f %12.0f\n",
                    format_bytes(reported_bytes).c_str(), op_name(op),
                    static_cast<long long>(iters), time_s * 1e6, algbw_gbps, busbw_gbps,
                    net_tx_per_op);
      }
      std::fflush(stdout);
    }
  }
  comm->barrier()->wait();
}

void run_bench_comm(const BenchCommArgs& args) {
  const int64_t min_bytes = parse_bytes(args.min_bytes, "--min-bytes");
  const int64_t max_bytes = parse_bytes(args.max_bytes, "--max-bytes");
  if (min_bytes < 4 || max_bytes < min_bytes) {
    throw_error("--min-bytes {} and --max-bytes {} must satisfy 4 <= min <= max", args.min_bytes,
                args.max_bytes);
  }
  int64_t iters = 0;
  if (args.iters != "auto") {
    try {
      iters = std::stoll(args.iters);
    } catch (const std::exception&) {
      iters = 0;
    }
    if (iters <= 0) throw_error("--iters '{}' must be 'auto' or a positive integer", args.iters);
  }
  if (args.backend != "shm" && args.backend != "gloo" && args.backend != "hierarchical") {
    throw_error("--backend '{}' is not a backend: use shm (one node), gloo (TCP) or hierarchical",
                args.backend);
  }
  if (args.shared && args.backend != "shm") {
    throw_error("--shared puts the buffers in the shm segment: it needs --backend shm");
  }
  if (args.nnodes > 1 && args.backend == "shm") {
    throw_error("--backend shm works within one node: across --nnodes {} use gloo or hierarchical",
                args.nnodes);
  }
  parse_ops(args.ops);  // a typo is one error here, not one per worker
  LaunchOptions launch;
  launch.nproc_per_node = args.nproc;
  launch.nnodes = args.nnodes;
  launch.node_rank = args.node_rank;
  launch.rdzv = args.rdzv;
  launch.rdzv_token = args.rdzv_token;
  launch.command = {"bench",       "comm-worker",
                    "--backend",   args.backend,
                    "--min-bytes", std::to_string(min_bytes),
                    "--max-bytes", std::to_string(max_bytes),
                    "--iters",     std::to_string(iters),
                    "--timeout-s", std::to_string(args.timeout_s),
                    "--ops",       args.ops};
  if (args.json) launch.command.push_back("--json");
  if (args.shared) launch.command.push_back("--shared");
  const int status = run_launch(launch);
  if (status != 0) {
    throw ExitStatus{status};
  }
}

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto args = std::make_shared<BenchCommArgs>();
  auto* comm = bench.add_subcommand(
      "comm",
      "Bus bandwidth and latency of the collectives between N local workers (nccl-tests' "
      "definitions)");
  comm->add_option("--nproc", args->nproc, "Worker processes")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  comm->add_option(
          "--backend", args->backend,
          "shm (shared memory), gloo (TCP) or hierarchical (shm in the node, gloo between nodes)")
      ->check(CLI::IsMember({"shm", "gloo", "hierarchical"}))
      ->capture_default_str();
  comm->add_option("--min-bytes", args->min_bytes, "Smallest size (4K, 1M, ...)")
      ->capture_default_str();
  comm->add_option("--max-bytes", args->max_bytes, "Largest size; sizes go up in powers of 4")
      ->capture_default_str();
  comm->add_option("--iters", args->iters,
                   "Timed operations per size and op: auto aims for 0.2 s each")
      ->capture_default_str();
  comm->add_option("--timeout-s", args->timeout_s, "Bound on the rendezvous and every operation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  comm->add_option("--ops", args->ops,
                   "all, or a comma-separated list of all_reduce, reduce_scatter, all_gather, "
                   "broadcast, send_recv")
      ->capture_default_str();
  comm->add_option("--nnodes", args->nnodes, "Nodes (as brigade launch; each runs --nproc)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  comm->add_option("--node-rank", args->node_rank, "This node's rank (as brigade launch)")
      ->capture_default_str();
  comm->add_option("--rdzv", args->rdzv, "HOST:PORT of node 0's store (as brigade launch)");
  comm->add_option("--rdzv-token", args->rdzv_token,
                   "The job's secret (as brigade launch; or BRIGADE_RDZV_TOKEN)");
  comm->add_flag("--json", args->json, "One JSON line per size and op");
  comm->add_flag("--shared", args->shared,
                 "shm only: buffers inside the shared segment, as training's flat buffers will "
                 "be (the zero-copy path)");
  comm->callback([args] { run_bench_comm(*args); });

  // What each launched worker runs; hidden (empty group): users call `comm`.
  auto worker_args = std::make_shared<BenchCommWorkerArgs>();
  auto* worker = bench.add_subcommand("comm-worker", "One worker of `bench comm`");
  worker->group("");
  worker->add_option("--backend", worker_args->backend)->required();
  worker->add_option("--min-bytes", worker_args->min_bytes)->required();
  worker->add_option("--max-bytes", worker_args->max_bytes)->required();
  worker->add_option("--iters", worker_args->iters);
  worker->add_option("--timeout-s", worker_args->timeout_s);
  worker->add_option("--ops", worker_args->ops);
  worker->add_flag("--json", worker_args->json);
  worker->add_flag("--shared", worker_args->shared);
  worker->callback([worker_args] { run_bench_comm_worker(*worker_args); });
}

}  // namespace brigade::cli

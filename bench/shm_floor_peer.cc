// shm_floor_peer: the least a small all-reduce can cost between the cores of
// this machine, as a yardstick for `brigade bench comm`'s latency.
//
//   shm_floor_peer [--nproc 2] [--bytes 4096] [--seconds 0.2] [--json]
//
// N forked processes share one anonymous mapping. Per operation each rank
// copies its f32 operand into its slot, publishes the operation number, spins
// until every peer has published it, and sums all slots in rank order into
// its operand: one synchronisation and the unavoidable traffic (each rank
// pulls every peer's operand from the peer's cache). No queue, no handle, no
// flight record, no timeout, no liveness check: nothing a real communicator
// can do without, so no implementation on this machine can beat it by much.
// Slots alternate between two halves, as in brigade's small all-reduce.
//
// Prints the slowest rank's mean time per operation (best of 5 runs), in the JSON keys of
// `brigade bench comm --json` ({"op": "all_reduce", "bytes", "time_us"}).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr int64_t kLine = 128;  // x86 prefetches line pairs: keep flags 128 bytes apart
// Timed runs of about --seconds each; the best counts. A floor is the least
// the machine allows, and the other tenants of a VM only ever add to it.
constexpr int kRepeats = 5;

struct alignas(kLine) Flag {
  std::atomic<uint64_t> value;
};

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Options {
  int nproc = 2;
  int64_t bytes = 4096;
  double seconds = 0.2;
  bool json = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "shm_floor_peer: %s\nusage: shm_floor_peer [--nproc N>=2] [--bytes B (multiple "
               "of 4)] [--seconds S] [--json]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--json") {
      o.json = true;
    } else if (arg == "--nproc" && has_value) {
      o.nproc = std::atoi(argv[++i]);
    } else if (arg == "--bytes" && has_value) {
      o.bytes = std::atoll(argv[++i]);
    } else if (arg == "--seconds" && has_value) {
      o.seconds = std::atof(argv[++i]);
    } else {
      usage(("unknown or incomplete argument '" + arg + "'").c_str());
    }
  }
  if (o.nproc < 2 || o.nproc > 64) usage("--nproc must be 2..64");
  if (o.bytes <= 0 || o.bytes % 4 != 0) usage("--bytes must be a positive multiple of 4");
  if (o.seconds <= 0) usage("--seconds must be positive");
  if (o.nproc > static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))) {
    usage(
        "--nproc is more than this machine's cores: ranks that spin without yielding would "
        "measure the scheduler, not the floor");
  }
  return o;
}

struct Shared {
  Flag* flags;      // [nproc] the last operation each rank published
  double* seconds;  // [nproc] each rank's measured time per operation
  uint64_t* iters;  // rank 0's calibrated iteration count, for everyone
  float* slots;     // [2 halves][nproc][count]
};

// One all-reduce of `data` as operation number `op` (starting at 1).
void all_reduce(const Shared& s, int rank, int nproc, int64_t count, float* data, uint64_t op) {
  float* half = s.slots + (op % 2) * nproc * count;
  std::memcpy(half + rank * count, data, count * sizeof(float));
  s.flags[rank].value.store(op, std::memory_order_release);
  for (int p = 0; p < nproc; ++p) {
    while (s.flags[p].value.load(std::memory_order_acquire) < op) relax();
  }
  std::memcpy(data, half, count * sizeof(float));
  for (int p = 1; p < nproc; ++p) {
    const float* in = half + p * count;
    for (int64_t i = 0; i < count; ++i) data[i] += in[i];
  }
}

void run_rank(const Shared& s, int rank, const Options& o) {
  const int64_t count = o.bytes / 4;
  std::vector<float> data(count);
  uint64_t op = 0;
  auto time_ops = [&](uint64_t n) {
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < n; ++i) all_reduce(s, rank, o.nproc, count, data.data(), ++op);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Check once, then calibrate on rank 0 and share the count through the
  // mapping (behind an all-reduce, which orders it for every rank).
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + i % 7);
  all_reduce(s, rank, o.nproc, count, data.data(), ++op);
  for (int64_t i = 0; i < count; ++i) {
    const float expected = static_cast<float>(o.nproc * (o.nproc - 1) / 2 + o.nproc * (i % 7));
    if (data[i] != expected) {
      std::fprintf(stderr, "shm_floor_peer: rank %d element %lld is %g, expected %g\n", rank,
                   static_cast<long long>(i), data[i], expected);
      std::_Exit(1);
    }
  }
  const double calibration = time_ops(1000);
  if (rank == 0) {
    *s.iters = static_cast<uint64_t>(std::max(1000.0, o.seconds / (calibration / 1000)));
  }
  time_ops(1);  // publishes *s.iters to every rank
  const uint64_t iters = *s.iters;
  double best = time_ops(iters);
  for (int repeat = 1; repeat < kRepeats; ++repeat) best = std::min(best, time_ops(iters));
  s.seconds[rank] = best / static_cast<double>(iters);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int64_t count = o.bytes / 4;
  const size_t bytes = 4096 + 2 * o.nproc * count * sizeof(float) + o.nproc * (sizeof(Flag) + 8);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("shm_floor_peer: mmap");
    return 1;
  }
  auto* base = static_cast<std::byte*>(mem);
  Shared s;
  s.flags = new (base) Flag[o.nproc]();
  s.seconds = reinterpret_cast<double*>(base + o.nproc * sizeof(Flag));
  s.iters = reinterpret_cast<uint64_t*>(s.seconds + o.nproc);
  s.slots = reinterpret_cast<float*>(base + 4096 + o.nproc * (sizeof(Flag) + 8));

  std::vector<pid_t> children;
  for (int rank = 0; rank < o.nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("shm_floor_peer: fork");
      for (pid_t c : children) ::kill(c, SIGKILL);
      return 1;
    }
    if (pid == 0) run_rank(s, rank, o);
    children.push_back(pid);
  }
  // A rank that fails leaves the others spinning: stop them.
  for (size_t left = children.size(); left > 0; --left) {
    int status = 0;
    if (::waitpid(-1, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      for (pid_t c : children) ::kill(c, SIGKILL);
      while (::waitpid(-1, nullptr, 0) > 0) {
      }
      std::fprintf(stderr, "shm_floor_peer: a rank failed\n");
      return 1;
    }
  }
  double slowest = 0;
  for (int rank = 0; rank < o.nproc; ++rank) slowest = std::max(slowest, s.seconds[rank]);
  if (o.json) {
    std::printf("{\"op\": \"all_reduce\", \"bytes\": %lld, \"nproc\": %d, \"time_us\": %.4f}\n",
                static_cast<long long>(o.bytes), o.nproc, slowest * 1e6);
  } else {
    std::printf("%lld-byte all-reduce floor, %d processes: %.3f us\n",
                static_cast<long long>(o.bytes), o.nproc, slowest * 1e6);
  }
  return 0;
}

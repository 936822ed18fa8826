#include "brigade/parallel/replica_check.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <new>
#include <utility>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"

namespace brigade {

namespace {
// Chunks of a fixed size, so the hash is the same whatever the thread count.
constexpr int64_t kChunk = int64_t{1} << 20;
}  // namespace

uint64_t hash_floats(const float* data, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) return XXH3_64bits(data, static_cast<size_t>(n) * sizeof(float));
  std::vector<uint64_t> hashes(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t begin = i * kChunk, count = std::min(kChunk, n - begin);
    hashes[static_cast<size_t>(i)] =
        XXH3_64bits(data + begin, static_cast<size_t>(count) * sizeof(float));
  }
  return XXH3_64bits(hashes.data(), hashes.size() * sizeof(uint64_t));
}

uint64_t combine_hashes(const std::vector<uint64_t>& hashes) {
  return XXH3_64bits(hashes.data(), hashes.size() * sizeof(uint64_t));
}

struct ChunkedHash::Chunk {
  XXH3_state_t* state = nullptr;  // while partly fed
  size_t fed = 0;                 // bytes from the chunk's start
  bool done = false;
  uint64_t hash = 0;
};

struct ChunkedHash::Buffer {
  const char* begin = nullptr;
  size_t bytes = 0;
  std::vector<Chunk> chunks;
};

ChunkedHash::ChunkedHash() = default;

ChunkedHash::~ChunkedHash() {
  for (Buffer& b : buffers_) {
    for (Chunk& c : b.chunks) XXH3_freeState(c.state);
  }
}

void ChunkedHash::add(const float* data, int64_t n) {
  Buffer b;
  b.begin = reinterpret_cast<const char*>(data);
  b.bytes = static_cast<size_t>(n) * sizeof(float);
  b.chunks.resize(static_cast<size_t>(std::max<int64_t>(1, (n + kChunk - 1) / kChunk)));
  buffers_.push_back(std::move(b));
}

void ChunkedHash::feed(const void* bytes, size_t count) {
  BRIGADE_CHECK(!finished_);  // what comes after finish() would not count
  const auto* at = static_cast<const char*>(bytes);
  constexpr size_t kChunkBytes = static_cast<size_t>(kChunk) * sizeof(float);
  for (Buffer& b : buffers_) {
    // Pointers into different objects are compared as addresses.
    const auto lo = std::max(reinterpret_cast<uintptr_t>(at), reinterpret_cast<uintptr_t>(b.begin));
    const auto hi = std::min(reinterpret_cast<uintptr_t>(at) + count,
                             reinterpret_cast<uintptr_t>(b.begin) + b.bytes);
    for (uintptr_t from = lo; from < hi;) {
      const size_t offset = from - reinterpret_cast<uintptr_t>(b.begin);
      Chunk& c = b.chunks[offset / kChunkBytes];
      const size_t chunk_start = offset / kChunkBytes * kChunkBytes;
      const size_t chunk_end = std::min(chunk_start + kChunkBytes, b.bytes);
      const size_t n = std::min<size_t>(hi - from, chunk_end - offset);
      if (!c.done && offset == chunk_start + c.fed) {
        if (c.state == nullptr) {
          c.state = XXH3_createState();
          if (c.state == nullptr) throw std::bad_alloc();
          XXH3_64bits_reset(c.state);
        }
        XXH3_64bits_update(c.state, b.begin + offset, n);
        c.fed += n;
        fed_bytes_ += static_cast<int64_t>(n);
        if (chunk_start + c.fed == chunk_end) {
          c.hash = XXH3_64bits_digest(c.state);
          XXH3_freeState(c.state);
          c.state = nullptr;
          c.done = true;
        }
      }
      from += n;
    }
  }
}

void ChunkedHash::finish() {
  constexpr size_t kChunkBytes = static_cast<size_t>(kChunk) * sizeof(float);
  hashes_.clear();
  for (Buffer& b : buffers_) {
    for (size_t i = 0; i < b.chunks.size(); ++i) {
      Chunk& c = b.chunks[i];
      if (c.done) continue;
      const size_t start = i * kChunkBytes, end = std::min(start + kChunkBytes, b.bytes);
      if (c.state == nullptr) {
        c.hash = XXH3_64bits(b.begin + start, end - start);
      } else {
        XXH3_64bits_update(c.state, b.begin + start + c.fed, end - start - c.fed);
        c.hash = XXH3_64bits_digest(c.state);
        XXH3_freeState(c.state);
        c.state = nullptr;
      }
      c.done = true;
    }
    // hash_floats' form: one chunk's own hash, or the hash of the chunks'.
    if (b.chunks.size() == 1) {
      hashes_.push_back(b.chunks[0].hash);
    } else {
      std::vector<uint64_t> chunk_hashes;
      for (const Chunk& c : b.chunks) chunk_hashes.push_back(c.hash);
      hashes_.push_back(combine_hashes(chunk_hashes));
    }
  }
  finished_ = true;
}

std::vector<int> odd_replicas(const std::vector<uint64_t>& hashes) {
  std::map<uint64_t, int> count;
  for (uint64_t h : hashes) ++count[h];
  std::vector<int> odd;
  if (count.size() <= 1) return odd;
  int best = 0, holders = 0;
  uint64_t majority = 0;
  for (const auto& [hash, n] : count) {
    if (n > best) {
      best = n;
      holders = 1;
      majority = hash;
    } else if (n == best) {
      ++holders;
    }
  }
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) {
    if (holders > 1 || hashes[static_cast<size_t>(r)] != majority) odd.push_back(r);
  }
  return odd;
}

GradientReplay gradient_disputes(std::vector<uint64_t> own, std::vector<uint64_t> replayed) {
  GradientReplay g;
  g.own = std::move(own);
  g.replayed = std::move(replayed);
  const int n = static_cast<int>(g.own.size());
  for (int r = 0; r < n; ++r) {
    const int replayer = (r + n - 1) % n;
    if (g.own[static_cast<size_t>(r)] == g.replayed[static_cast<size_t>(replayer)]) continue;
    g.disputes.push_back({r, replayer, n >= 3 ? (r + 1) % n : r, 0, false, false});
  }
  return g;
}

int gradient_settling_target(int me, int n) {
  return n >= 3 ? (me + n - 1) % n : me;
}

void settle_gradient_disputes(GradientReplay& g, const std::vector<uint64_t>& thirds) {
  for (GradientReplay::Dispute& d : g.disputes) {
    d.third = thirds[static_cast<size_t>(d.settler)];
    d.own_off = d.third == g.replayed[static_cast<size_t>(d.replayer)];
    d.replay_off = d.third == g.own[static_cast<size_t>(d.rank)];
  }
  // With two ranks, each disputing the other's: each rank's computations
  // agree with themselves and not with the other's, and no third rank says
  // which device is off (or whether they merely compute differently).
  if (g.own.size() == 2 && g.disputes.size() == 2) {
    for (GradientReplay::Dispute& d : g.disputes) d.own_off = d.replay_off = false;
  }
  g.suspects.clear();
  for (const GradientReplay::Dispute& d : g.disputes) {
    if (d.settled()) g.suspects.push_back(d.own_off ? d.rank : d.replayer);
  }
  std::sort(g.suspects.begin(), g.suspects.end());
  g.suspects.erase(std::unique(g.suspects.begin(), g.suspects.end()), g.suspects.end());
}

ReplicaComparison compare_replicas(Communicator& group, uint64_t mine) {
  ReplicaComparison c;
  c.hashes.resize(static_cast<size_t>(group.size()));
  group.all_gather(&mine, c.hashes.data(), 1, DType::kI64)->wait();
  c.suspects = odd_replicas(c.hashes);
  return c;
}

}  // namespace brigade

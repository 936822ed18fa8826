#include "brigade/parallel/replica_check.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "brigade/comm/communicator.h"

namespace brigade {

uint64_t hash_floats(const float* data, int64_t n) {
  // Chunks of a fixed size, so the hash is the same whatever the thread count.
  constexpr int64_t kChunk = int64_t{1} << 20;
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

#include "brigade/parallel/replica_check.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include "brigade/comm/communicator.h"

namespace brigade {

uint64_t hash_floats(const float* data, int64_t n) {
  return XXH3_64bits(data, static_cast<size_t>(n) * sizeof(float));
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

ReplicaComparison compare_replicas(Communicator& group, uint64_t mine) {
  ReplicaComparison c;
  c.hashes.resize(static_cast<size_t>(group.size()));
  group.all_gather(&mine, c.hashes.data(), 1, DType::kI64)->wait();
  c.suspects = odd_replicas(c.hashes);
  return c;
}

}  // namespace brigade

// Silent data corruption checks between data-parallel replicas.
//
// Under ZeRO 0, 1 and 2 every rank of a data-parallel group holds the same
// parameters between updates, bit for bit (the same reduced gradients go
// through the same update, or the owners' updates are all-gathered), and
// under ZeRO 0 the same Adam moments too. A rank whose copy differs was
// corrupted: by a faulty unit in its update, a flipped bit in its memory, a
// bad transfer. Comparing the replicas costs one 64-bit hash of the buffers
// per rank (XXH3, memory-bound: it reads them once, in chunks spread over
// the OpenMP threads) and one all-gather of 8 bytes per rank. What the
// group computed identically from one corrupted input (an all-reduced
// gradient that one rank's faulty backward polluted) stays identical and
// cannot be caught this way, nor what exists once (ZeRO 3's parameter
// slices, ZeRO 1/2's moment slices): only replicas are compared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brigade {

class Communicator;

// A 64-bit hash of n floats (their bytes): XXH3 of each chunk of 2^20
// floats, hashed on the OpenMP threads, then XXH3 of those hashes (a
// buffer of one chunk or less: its plain XXH3). The chunking is fixed, so
// ranks with different thread counts agree.
uint64_t hash_floats(const float* data, int64_t n);
// One hash of several (XXH3 of their bytes, in order).
uint64_t combine_hashes(const std::vector<uint64_t>& hashes);

// The ranks whose hash is not the majority's: with one hash held by more
// ranks than any other, everyone else; with no such hash (two replicas
// that differ, or a tie), every rank, since nothing says which copy is
// right. Empty when all agree.
std::vector<int> odd_replicas(const std::vector<uint64_t>& hashes);

struct ReplicaComparison {
  std::vector<uint64_t> hashes;  // by rank of the group
  std::vector<int> suspects;     // odd_replicas(hashes)
  std::string compared;          // what was hashed, for people: "parameters (1234 floats)"
  bool clean() const { return suspects.empty(); }
};

// Trainer::replay_gradients' verdict, by rank of the data-parallel group.
struct GradientReplay {
  std::vector<uint64_t> own;       // each rank's local gradient of the step
  std::vector<uint64_t> replayed;  // rank r's recomputation of rank (r + 1) % n's
  std::vector<uint64_t> again;     // each rank's own once more; empty when all agreed
  std::vector<int> suspects;       // group ranks
  bool clean() const { return suspects.empty(); }
};

// Collective over `group`: every rank passes its hash and gets every rank's
// (one all-gather of 8 bytes each) and the same verdict.
ReplicaComparison compare_replicas(Communicator& group, uint64_t mine);

}  // namespace brigade

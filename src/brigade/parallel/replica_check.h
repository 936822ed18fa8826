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
// Rank r's gradient is disputed when its own hash differs from its
// replayer's (rank (r - 1) % n recomputed r's micro-batches). A third
// computation settles it: by rank (r + 1) % n when n >= 3 (neither side of
// the dispute, so a device that computes wrong every time is outvoted, not
// believed), by r itself when n is 2 (the only other rank is the replayer).
struct GradientReplay {
  struct Dispute {
    int rank = 0;      // whose gradient
    int replayer = 0;  // (rank - 1) % n
    int settler = 0;   // who computed `third`
    uint64_t third = 0;
    // Which side the third computation agrees with; neither: unsettled.
    bool own_off = false;
    bool replay_off = false;
    bool settled() const { return own_off != replay_off; }
  };
  std::vector<uint64_t> own;       // each rank's local gradient of the step
  std::vector<uint64_t> replayed;  // rank r's recomputation of rank (r + 1) % n's
  std::vector<Dispute> disputes;
  // Group ranks named by the settled disputes. Empty with disputes left:
  // nothing settles which side was off (kernel non-determinism across or
  // within ranks, or faults that cannot be told from it).
  std::vector<int> suspects;
  bool clean() const { return disputes.empty(); }
};

// The disputes of a replay (`own` and `replayed` by group rank), their
// settlers chosen, nothing settled yet.
GradientReplay gradient_disputes(std::vector<uint64_t> own, std::vector<uint64_t> replayed);
// Whose micro-batches group rank `me` of `n` recomputes for the third
// computation: rank me - 1's (it settles that rank's dispute) with n >= 3,
// its own with 2. Every rank computes one when there is any dispute.
int gradient_settling_target(int me, int n);
// Settles g's disputes from every rank's third computation (`thirds`, by
// group rank, of gradient_settling_target's micro-batches) and names the
// suspects. With two ranks disputing each other's, nothing is settled.
void settle_gradient_disputes(GradientReplay& g, const std::vector<uint64_t>& thirds);

// Collective over `group`: every rank passes its hash and gets every rank's
// (one all-gather of 8 bytes each) and the same verdict.
ReplicaComparison compare_replicas(Communicator& group, uint64_t mine);

}  // namespace brigade

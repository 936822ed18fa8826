// Silent data corruption checks between data-parallel replicas.
//
// Under ZeRO 0, 1 and 2 every rank of a data-parallel group holds the same
// parameters between updates, bit for bit (the same reduced gradients go
// through the same update, or the owners' updates are all-gathered), and
// under ZeRO 0 the same Adam moments too. A rank whose copy differs was
// corrupted: by a faulty unit in its update, a flipped bit in its memory, a
// bad transfer. Comparing the replicas costs one 64-bit hash of the buffers
// per rank and one all-gather of 8 bytes per rank. The hash is XXH3 of the
// parameters under ZeRO 1/2 (hash_floats, below), and under ZeRO 0
// cpu::state_hash of parameters and moments, a sum of per-element terms
// that the optimizer's update can take block by block from L1 while it
// writes them (AdamW::step), however its work is cut. What the
// group computed identically from one corrupted input (an all-reduced
// gradient that one rank's faulty backward polluted) stays identical and
// cannot be caught this way, nor what exists once (ZeRO 3's parameter
// slices, ZeRO 1/2's moment slices): only replicas are compared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

// hash_floats of several buffers, taken from bytes another pass reads
// anyway: an in-memory snapshot's copy feeds what it copies, while it is
// in cache, and finish() reads only what the copy did not see. The values
// equal hash_floats' of the buffers as they were when fed (XXH3's streaming
// form gives its one-shot value), provided they did not change between the
// first feed and finish(): the caller's to guarantee (train/trainer.h,
// fused_replica_hash).
class ChunkedHash {
 public:
  ChunkedHash();
  ~ChunkedHash();
  ChunkedHash(const ChunkedHash&) = delete;
  ChunkedHash& operator=(const ChunkedHash&) = delete;

  // A buffer to hash, whole; buffers do not overlap. Before any feed().
  void add(const float* data, int64_t n);
  // Bytes just read: those inside an added buffer go into the hash of the
  // chunk they lie in where they continue what it was fed so far (bytes
  // out of order, or outside every buffer, are left to finish()).
  void feed(const void* bytes, size_t count);
  // Hashes what feed() left out, from the buffers themselves; then
  // hashes() gives each buffer's hash_floats, in the order added.
  void finish();
  bool finished() const { return finished_; }
  const std::vector<uint64_t>& hashes() const { return hashes_; }
  // Bytes that feed() hashed, for tests and benchmarks.
  int64_t fed_bytes() const { return fed_bytes_; }

 private:
  struct Chunk;
  struct Buffer;
  std::vector<Buffer> buffers_;
  std::vector<uint64_t> hashes_;
  int64_t fed_bytes_ = 0;
  bool finished_ = false;
};

// The ranks whose hash is not the majority's: with one hash held by more
// ranks than any other, everyone else; with no such hash (two replicas
// that differ, or a tie), every rank, since nothing says which copy is
// right. Empty when all agree.
std::vector<int> odd_replicas(const std::vector<uint64_t>& hashes);

struct ReplicaComparison {
  std::vector<uint64_t> hashes;  // by rank of the group
  std::vector<int> suspects;     // odd_replicas(hashes)
  std::string compared;          // what was hashed, for people: "parameters (1234 floats)"
  // This rank's hash came from the update that wrote the state (ZeRO 0)
  // or from an in-memory snapshot's copy of it (ZeRO 1/2) instead of a
  // pass of its own (Trainer::compare_replicas).
  bool fused = false;
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

// AdamW over a flat parameter buffer, with weight decay only where it belongs.
//
// The buffer is described as ranges, each decayed or not; the optimizer does
// not know what a "layer" is (ARCHITECTURE.md: optim/ knows nothing of who
// owns which shard). It updates either the whole buffer or a given set of
// slices of it (a ZeRO rank's share, from parallel/); the moments m and v
// hold exactly the updated elements, slice after slice, so a rank's
// optimizer state is its share and no more.
#pragma once

#include <cstdint>
#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/kernels/cpu/vector_ops.h"

namespace brigade {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// A contiguous range [begin, end) of the flat buffer and whether it decays.
struct DecayRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool decay = false;
};

// A slice [begin, end) of the flat buffer that an optimizer updates.
struct Slice {
  int64_t begin = 0;
  int64_t end = 0;
};

// Where an update also writes the new values of the flat elements [begin,
// end): a run of end - begin floats each for the parameters and the two
// moments (any may be null).
struct StateCopy {
  int64_t begin = 0;
  int64_t end = 0;
  cpu::AdamWCopy to;
};

class AdamW {
 public:
  // Updates all of [0, size).
  AdamW(const AdamWConfig& config, const std::vector<DecayRange>& ranges, int64_t size);
  // Updates only `slices` (disjoint, any order); m and v are compact.
  AdamW(const AdamWConfig& config, const std::vector<DecayRange>& ranges,
        const std::vector<Slice>& slices);

  // One update with gradients grads * grad_scale (the clipping factor).
  // params and grads are the whole flat buffers; only the slices are read
  // and written. step_count() increments first, so the first update has
  // bias-correction step 1.
  void step(float* params, const float* grads, double lr, double grad_scale = 1.0);
  // The same update, which also writes the new values of the elements that
  // `copies` cover (sorted by begin, disjoint; elements it does not update
  // are not written) where they say, bit for bit what it stores: how an
  // in-memory snapshot is taken without a pass of its own over the state
  // (train/trainer.h).
  // With `hash` (non-null), also adds to *hash the state_hash of what it
  // updated, as state_hash() below would read it afterwards.
  void step(float* params, const float* grads, double lr, double grad_scale,
            const std::vector<StateCopy>& copies, uint64_t* hash = nullptr);
  // cpu::state_hash of the elements it updates (parameters at their flat
  // offsets, moments), read from memory: equal on replicas that hold the
  // same state. Under ZeRO 0 that is every parameter element of the model
  // and both whole moments (the buffers' padding is never updated).
  uint64_t state_hash(const float* params) const;

  const std::vector<Slice>& slices() const { return slices_; }
  // Elements updated: the length of m and v.
  int64_t size() const { return m_.size(); }

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  FloatBuffer& m() { return m_; }
  FloatBuffer& v() { return v_; }
  const FloatBuffer& m() const { return m_; }
  const FloatBuffer& v() const { return v_; }

 private:
  // A run of elements with one decay flag: buffer offset and moment offset.
  struct Piece {
    int64_t begin = 0;
    int64_t moment = 0;
    int64_t n = 0;
    bool decay = false;
  };

  AdamWConfig config_;
  std::vector<Slice> slices_;
  std::vector<Piece> pieces_;
  FloatBuffer m_;
  FloatBuffer v_;
  int64_t step_count_ = 0;
};

}  // namespace brigade

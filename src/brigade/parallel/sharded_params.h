// ZeRO 3's parameters: each rank keeps only its slices of the flat parameter
// buffer (BucketPlan::slice of every bucket); the rest of each bucket is
// all-gathered from the owners just before the model reads it and given
// back to the operating system right after.
//
// The model drives it through Gpt's ParamResidency calls: acquire(range)
// gathers every bucket that overlaps the range (unless it is already here
// or on its way) and waits; prefetch(range) only starts the gathers, so the
// next block's parameters travel while this block computes; release(range)
// drops a reference, and a bucket nobody holds loses its unowned pages
// (madvise, as ZeRO 2's gradients; they read as zeros until the next gather).
// The owned slices are never released: the optimizer updates them in place.
//
// All ranks must make the same calls in the same order (the model's passes
// do), since each gather is a collective.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "brigade/model/gpt.h"
#include "brigade/parallel/grad_buckets.h"

namespace brigade {

class Communicator;
class Work;

class ShardedParams final : public ParamResidency {
 public:
  // params: plan.padded_size() floats holding the full, identical
  // parameters on every rank (after initialisation or loading); the
  // constructor releases everything this rank does not own.
  ShardedParams(Communicator& comm, const BucketPlan& plan, float* params, bool shared_memory);
  ~ShardedParams() override;

  void prefetch(int64_t begin, int64_t end) override;
  void acquire(int64_t begin, int64_t end) override;
  void release(int64_t begin, int64_t end) override;

  // Drops the unowned parts of every bucket nobody holds, after the caller
  // wrote the whole buffer (loading a checkpoint).
  void release_unheld();

  // Milliseconds acquire() spent waiting for gathers since the last call:
  // communication the prefetch did not hide.
  double take_wait_ms();

  // Bytes of parameters resident now, owned slices included.
  int64_t resident_bytes() const;
  // The most resident_bytes() has been since construction.
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }

 private:
  enum class State { kReleased, kGathering, kResident };
  struct Bucket {
    State state = State::kReleased;
    int refs = 0;
    std::shared_ptr<Work> gather;
  };
  // The buckets overlapping [begin, end): indices into plan_.buckets().
  std::vector<size_t> overlapping(int64_t begin, int64_t end) const;
  void start_gather(size_t index);
  void drop(size_t index);

  Communicator& comm_;
  const BucketPlan& plan_;
  float* params_;
  bool shared_memory_;
  std::vector<Bucket> buckets_;
  int64_t peak_resident_bytes_ = 0;
  int64_t wait_ns_ = 0;
};

}  // namespace brigade

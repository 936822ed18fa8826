// Data-parallel gradient reduction, overlapped with backward.
//
// During the last micro-batch of a step the model reports, block by block,
// from which flat offset on its gradients are final (Gpt's grad-ready hook).
// Each bucket of the BucketPlan whose range is then complete is handed to
// the communicator at once, so its reduction runs on the communication
// thread while backward computes the earlier layers. finish() waits for the
// rest; the time it waits is the communication that compute did not hide.
//
// Gradients are summed (the loss scale already divides by the global batch).
// Unsharded (ZeRO 0), each bucket is all-reduced: every rank ends with the
// whole reduced gradient. Sharded (ZeRO 1 and 2), each bucket is
// reduce-scattered in place: rank r ends with the reduced values of its
// slices only (BucketPlan::slice) and the rest of the buffer is stale.
//
// Releasing (ZeRO 2): as soon as a bucket's reduce-scatter is done, the
// pages of the bucket outside this rank's slice go back to the operating
// system (madvise; MADV_REMOVE for shared memory) and read as zeros after,
// so the rank keeps only its slices between steps, and the next backward
// starts from zeros there without touching them. Backward writes the
// buckets in reduction order, so the next one's released pages are taken
// back in one call (populate_for_write) when its predecessor is launched
// (bucket 0's when armed) rather than faulted in one by one by the kernels:
// one bucket ahead, within the peak the release keeps. Only the last
// micro-batch's backward is armed: with grad_accum > 1 (and in a pipeline's
// micro-batches) the first backward of the step has faulted them in already.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "brigade/parallel/grad_buckets.h"

namespace brigade {

class Communicator;
class Work;

// One bucket's reduction in the last step: when it was handed to the
// communicator and when the reduction finished, relative to arm().
struct BucketTiming {
  int64_t bytes = 0;
  double issued_ms = 0;
  double done_ms = 0;
};

class GradSync {
 public:
  enum class Mode {
    kAllReduce,                // ZeRO 0
    kReduceScatter,            // ZeRO 1
    kReduceScatterAndRelease,  // ZeRO 2
  };
  // grads: plan.padded_size() floats, alive as long as this object;
  // grads_shared: whether they live in shared memory (for releasing).
  GradSync(Communicator& comm, const BucketPlan& plan, float* grads, Mode mode, bool grads_shared);
  ~GradSync();

  // Called before the last micro-batch's backward: no bucket is in flight.
  void arm();
  // The model's grad-ready hook: launches every unlaunched bucket that lies
  // entirely at or above ready_from.
  void on_ready(int64_t ready_from);
  // Launches whatever is left and waits for every bucket. Returns the
  // milliseconds spent waiting (exposed communication). Throws CommError.
  double finish();

  const std::vector<BucketTiming>& timings() const { return timings_; }
  // When backward ended in the last step, in the timings' clock: the
  // on_ready(0) call (every gradient final), or finish() if none came. A
  // bucket issued before it is a reduction that overlapped backward.
  double backward_end_ms() const { return backward_end_ms_; }
  // Buckets handed to the communicator since arm(), in plan order: buckets()[0,
  // launched()).
  size_t launched() const { return next_; }

 private:
  void launch(size_t index);
  // Records backward_end_ms() once per step.
  void stamp_backward_end();
  // Takes back the released pages of bucket next_ (ZeRO 2), which backward
  // writes next.
  void populate_next();
  // Releases the finished buckets' unowned parts (ZeRO 2).
  void release_finished(bool wait);

  Communicator& comm_;
  const BucketPlan& plan_;
  float* grads_;
  Mode mode_;
  bool grads_shared_;
  size_t next_ = 0;  // buckets [0, next_) are launched (reduction order)
  std::vector<std::shared_ptr<Work>> works_;
  std::vector<BucketTiming> timings_;
  int64_t armed_ns_ = 0;
  double backward_end_ms_ = -1.0;  // -1 until this step's backward ended
};

}  // namespace brigade

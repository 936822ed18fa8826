#include "brigade/parallel/grad_sync.h"

#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/pages.h"

namespace brigade {

GradSync::GradSync(Communicator& comm, const BucketPlan& plan, float* grads, Mode mode,
                   bool grads_shared)
    : comm_(comm),
      plan_(plan),
      grads_(grads),
      mode_(mode),
      grads_shared_(grads_shared),
      works_(plan.buckets().size()),
      timings_(plan.buckets().size()) {
  BRIGADE_CHECK(comm.size() == plan.dp(), "the communicator is the data-parallel group");
}

// Waits for anything still in flight, so no reduction outlives the buffers.
GradSync::~GradSync() {
  for (auto& work : works_) {
    if (!work) continue;
    try {
      work->wait();
    } catch (const std::exception&) {
      // Already reported by finish(), or the step is being abandoned.
    }
  }
}

void GradSync::arm() {
  for (auto& work : works_) work.reset();
  next_ = 0;
  armed_ns_ = now_ns();
  backward_end_ms_ = -1.0;
  populate_next();
}

void GradSync::populate_next() {
  if (mode_ != Mode::kReduceScatterAndRelease || next_ >= plan_.buckets().size()) return;
  for (const FlatRange part : plan_.unowned(static_cast<int64_t>(next_), comm_.rank())) {
    populate_for_write(grads_ + part.begin, grads_ + part.end);
  }
}

void GradSync::stamp_backward_end() {
  if (backward_end_ms_ < 0) backward_end_ms_ = static_cast<double>(now_ns() - armed_ns_) * 1e-6;
}

void GradSync::launch(size_t index) {
  const FlatRange& bucket = plan_.buckets()[index];
  float* data = grads_ + bucket.begin;
  // Stamped before the hand-off: a small reduction can finish before the
  // call returns.
  timings_[index] = {bucket.size() * static_cast<int64_t>(sizeof(float)),
                     static_cast<double>(now_ns() - armed_ns_) * 1e-6, 0.0};
  if (mode_ != Mode::kAllReduce) {
    const FlatRange mine = plan_.slice(static_cast<int64_t>(index), comm_.rank());
    works_[index] =
        comm_.reduce_scatter(data, grads_ + mine.begin, mine.size(), DType::kF32, ReduceOp::kSum);
  } else {
    works_[index] = comm_.all_reduce(data, bucket.size(), DType::kF32, ReduceOp::kSum);
  }
}

void GradSync::on_ready(int64_t ready_from) {
  // Stamped before launching: what the last call launches did not overlap.
  if (ready_from == 0) stamp_backward_end();
  const auto& buckets = plan_.buckets();
  const size_t before = next_;
  while (next_ < buckets.size() && buckets[next_].begin >= ready_from) launch(next_++);
  if (mode_ == Mode::kReduceScatterAndRelease) release_finished(false);
  if (next_ != before) populate_next();
}

void GradSync::release_finished(bool wait) {
  for (size_t i = 0; i < next_; ++i) {
    if (!works_[i] || (!wait && !works_[i]->test())) continue;
    works_[i]->wait();  // rethrows a failure
    timings_[i].done_ms = static_cast<double>(works_[i]->finished_ns() - armed_ns_) * 1e-6;
    works_[i].reset();
    if (mode_ != Mode::kReduceScatterAndRelease) continue;
    for (const FlatRange part : plan_.unowned(static_cast<int64_t>(i), comm_.rank())) {
      release_as_zeros(grads_ + part.begin, grads_ + part.end, grads_shared_);
    }
  }
}

double GradSync::finish() {
  stamp_backward_end();
  while (next_ < plan_.buckets().size()) launch(next_++);
  const int64_t start = now_ns();
  release_finished(true);
  return static_cast<double>(now_ns() - start) * 1e-6;
}

}  // namespace brigade

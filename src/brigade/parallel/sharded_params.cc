#include "brigade/parallel/sharded_params.h"

#include <algorithm>

#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/pages.h"

namespace brigade {

ShardedParams::ShardedParams(Communicator& comm, const BucketPlan& plan, float* params,
                             bool shared_memory)
    : comm_(comm),
      plan_(plan),
      params_(params),
      shared_memory_(shared_memory),
      buckets_(plan.buckets().size()) {
  BRIGADE_CHECK(comm.size() == plan.dp(), "the communicator is the data-parallel group");
  for (size_t i = 0; i < buckets_.size(); ++i) {
    buckets_[i].state = State::kResident;
    drop(i);
  }
  peak_resident_bytes_ = resident_bytes();
}

ShardedParams::~ShardedParams() {
  for (Bucket& bucket : buckets_) {
    if (!bucket.gather) continue;
    try {
      bucket.gather->wait();
    } catch (const std::exception&) {
      // The step that started it has failed already.
    }
  }
}

std::vector<size_t> ShardedParams::overlapping(int64_t begin, int64_t end) const {
  std::vector<size_t> out;
  const auto& buckets = plan_.buckets();
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].begin < end && begin < buckets[i].end) out.push_back(i);
  }
  return out;
}

void ShardedParams::start_gather(size_t index) {
  const FlatRange bucket = plan_.buckets()[index];
  const FlatRange mine = plan_.slice(static_cast<int64_t>(index), comm_.rank());
  buckets_[index].gather =
      comm_.all_gather(params_ + mine.begin, params_ + bucket.begin, mine.size(), DType::kF32);
  buckets_[index].state = State::kGathering;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes());
}

void ShardedParams::drop(size_t index) {
  for (const FlatRange part : plan_.unowned(static_cast<int64_t>(index), comm_.rank())) {
    release_as_zeros(params_ + part.begin, params_ + part.end, shared_memory_);
  }
  buckets_[index].state = State::kReleased;
}

void ShardedParams::prefetch(int64_t begin, int64_t end) {
  for (const size_t i : overlapping(begin, end)) {
    if (buckets_[i].state == State::kReleased) start_gather(i);
  }
}

void ShardedParams::acquire(int64_t begin, int64_t end) {
  const std::vector<size_t> indices = overlapping(begin, end);
  for (const size_t i : indices) {
    if (buckets_[i].state == State::kReleased) start_gather(i);
  }
  for (const size_t i : indices) {
    Bucket& bucket = buckets_[i];
    if (bucket.state == State::kGathering) {
      const int64_t start = now_ns();
      bucket.gather->wait();
      wait_ns_ += now_ns() - start;
      bucket.gather.reset();
      bucket.state = State::kResident;
    }
    ++bucket.refs;
  }
}

void ShardedParams::release(int64_t begin, int64_t end) {
  for (const size_t i : overlapping(begin, end)) {
    Bucket& bucket = buckets_[i];
    BRIGADE_CHECK(bucket.refs > 0, "release of parameters that were not acquired");
    if (--bucket.refs == 0) drop(i);
  }
}

void ShardedParams::release_unheld() {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& bucket = buckets_[i];
    if (bucket.refs > 0) continue;
    if (bucket.gather) {
      bucket.gather->wait();
      bucket.gather.reset();
    }
    drop(i);
  }
}

double ShardedParams::take_wait_ms() {
  const double ms = static_cast<double>(wait_ns_) * 1e-6;
  wait_ns_ = 0;
  return ms;
}

int64_t ShardedParams::resident_bytes() const {
  int64_t floats = plan_.owned_size();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].state != State::kReleased) {
      floats += plan_.buckets()[i].size() - plan_.slice(static_cast<int64_t>(i), 0).size();
    }
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace brigade

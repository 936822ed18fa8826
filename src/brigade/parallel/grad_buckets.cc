#include "brigade/parallel/grad_buckets.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade {

BucketPlan::BucketPlan(int64_t num_elements, int dp, int64_t bucket_elements) : dp_(dp) {
  if (dp < 1) throw_error("data-parallel size {} must be at least 1", dp);
  if (num_elements < 1) throw_error("cannot plan buckets for an empty buffer");
  if (bucket_elements < 1) {
    throw_error("gradient bucket size must be positive, got {} elements", bucket_elements);
  }
  const int64_t unit = dp * kAlignFloats;
  padded_size_ = (num_elements + unit - 1) / unit * unit;
  const int64_t bucket = std::min((bucket_elements + unit - 1) / unit * unit, padded_size_);
  for (int64_t end = padded_size_; end > 0; end -= bucket) {
    buckets_.push_back({std::max<int64_t>(end - bucket, 0), end});
  }
}

BucketPlan::BucketPlan(int64_t num_elements, int dp, const std::vector<int64_t>& cuts) : dp_(dp) {
  if (dp < 1) throw_error("data-parallel size {} must be at least 1", dp);
  if (num_elements < 1) throw_error("cannot plan buckets for an empty buffer");
  const int64_t unit = dp * kAlignFloats;
  padded_size_ = (num_elements + unit - 1) / unit * unit;
  std::vector<int64_t> points = {0, padded_size_};
  for (const int64_t cut : cuts) {
    BRIGADE_CHECK(cut >= 0 && cut <= num_elements, "cut {} outside the buffer", cut);
    points.push_back(cut / unit * unit);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  for (size_t i = points.size() - 1; i > 0; --i) buckets_.push_back({points[i - 1], points[i]});
}

FlatRange BucketPlan::slice(int64_t index, int rank) const {
  BRIGADE_CHECK(index >= 0 && index < static_cast<int64_t>(buckets_.size()));
  BRIGADE_CHECK(rank >= 0 && rank < dp_);
  const FlatRange& bucket = buckets_[static_cast<size_t>(index)];
  const int64_t share = bucket.size() / dp_;
  return {bucket.begin + rank * share, bucket.begin + (rank + 1) * share};
}

std::array<FlatRange, 2> BucketPlan::unowned(int64_t index, int rank) const {
  const FlatRange mine = slice(index, rank);
  const FlatRange& bucket = buckets_[static_cast<size_t>(index)];
  return {FlatRange{bucket.begin, mine.begin}, FlatRange{mine.end, bucket.end}};
}

std::vector<FlatRange> BucketPlan::owned(int rank) const {
  std::vector<FlatRange> slices;
  for (int64_t i = 0; i < static_cast<int64_t>(buckets_.size()); ++i) {
    slices.push_back(slice(i, rank));
  }
  return slices;
}

std::string BucketPlan::describe() const {
  return fmt::format("{} bucket(s) of up to {:.1f} MB, dp {}", buckets_.size(),
                     static_cast<double>(buckets_.front().size()) * 4 / 1e6, dp_);
}

}  // namespace brigade

// How data parallelism cuts the flat gradient buffer into buckets, and which
// piece of each bucket a rank owns under ZeRO.
//
// The flat buffers are padded to a multiple of dp * kAlignFloats elements
// (the padding holds zeros that never change). Buckets are contiguous ranges
// cut from the END of the buffer backwards, because backward produces
// gradients from the last layer to the first: the tail bucket is ready
// first. Every bucket's length is a multiple of dp * kAlignFloats, so it
// splits into dp equal, 64-byte-aligned slices; rank r owns slice r of every
// bucket. That is ZeRO's partition: a bucket's reduce-scatter leaves each
// rank exactly its slice, and the optimizer updates exactly those slices.
//
//   buffer:  [ bucket 2 ........ | bucket 1 ........ | bucket 0 ........ ]
//   owner:   [ r0 | r1 | r2 | r3 | r0 | r1 | r2 | r3 | r0 | r1 | r2 | r3 ]
//   reduce order: bucket 0 (the tail) first
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace brigade {

// A range [begin, end) of the flat buffer.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class BucketPlan {
 public:
  static constexpr int64_t kAlignFloats = 16;  // 64 bytes

  // num_elements: the unpadded buffer length (ParamLayout::size()).
  // bucket_elements: the target bucket length (rounded up to a multiple of
  // dp * kAlignFloats; the first bucket of the buffer takes the remainder).
  BucketPlan(int64_t num_elements, int dp, int64_t bucket_elements);
  // Buckets cut at the given offsets instead (each rounded down to a
  // multiple of dp * kAlignFloats; 0 and the end are implied): ZeRO 3 cuts
  // at block boundaries, so gathering one block's parameters moves one or
  // two buckets rather than a fixed-size window.
  BucketPlan(int64_t num_elements, int dp, const std::vector<int64_t>& cuts);

  // The buffer length every rank allocates: num_elements rounded up.
  int64_t padded_size() const { return padded_size_; }
  int dp() const { return dp_; }
  // Buckets in reduction order: buckets()[0] ends at padded_size().
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  // Rank `rank`'s slice of bucket `index`.
  FlatRange slice(int64_t index, int rank) const;
  // The two parts of bucket `index` outside that slice (before it, after
  // it; either may be empty): what ZeRO 2 and 3 release and take back.
  std::array<FlatRange, 2> unowned(int64_t index, int rank) const;
  // Rank `rank`'s slices of every bucket, in reduction order.
  std::vector<FlatRange> owned(int rank) const;
  // Elements rank `rank` owns in total: padded_size() / dp.
  int64_t owned_size() const { return padded_size_ / dp_; }

  std::string describe() const;  // "12 buckets of ~25.0 MB, dp 4"

 private:
  int64_t padded_size_ = 0;
  int dp_ = 1;
  std::vector<FlatRange> buckets_;
};

}  // namespace brigade

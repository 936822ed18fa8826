// A box of a global tensor: the elements whose index along every dimension d
// lies in [offsets[d], offsets[d] + sizes[d]). Every shard of a checkpoint is
// described as boxes of global tensors, whatever cut it: a ZeRO rank's flat
// range of the parameter buffer crosses tensors and rows (a few boxes per
// tensor, see flat_range_boxes), a tensor-parallel shard is one box per
// tensor (a row or column block), a pipeline stage owns whole tensors. So
// later parallelism only adds writers; the format and the loader stay.
#pragma once

#include <cstdint>
#include <vector>

namespace brigade {

struct TensorBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
  bool operator==(const TensorBox&) const = default;
};

// The row-major elements [begin, end) of a tensor of `shape`, as boxes in
// storage order: at most 2 * rank - 1 of them. Their elements, box after
// box and each in row-major order, are exactly elements begin..end-1.
std::vector<TensorBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                        int64_t end);

// Whether the box lies inside a tensor of `shape` (same rank, non-negative).
bool box_inside(const TensorBox& box, const std::vector<int64_t>& shape);
// Whether two boxes of one tensor share an element.
bool boxes_overlap(const TensorBox& a, const TensorBox& b);

// Copies a box's elements, stored contiguously in row-major box order, into
// their places in the row-major tensor `tensor` of `shape`.
void scatter_box(const float* box_data, const TensorBox& box, const std::vector<int64_t>& shape,
                 float* tensor);

}  // namespace brigade

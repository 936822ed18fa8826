#include "brigade/ckpt/tensor_box.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "brigade/core/error.h"

namespace brigade {

int64_t TensorBox::numel() const {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
}

std::vector<TensorBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                        int64_t end) {
  BRIGADE_CHECK(!shape.empty(), "a tensor of rank 0 has no boxes");
  std::vector<TensorBox> boxes;
  if (begin >= end) return boxes;
  if (shape.size() == 1) {
    boxes.push_back({{begin}, {end - begin}});
    return boxes;
  }
  const std::vector<int64_t> inner_shape(shape.begin() + 1, shape.end());
  const int64_t inner =
      std::accumulate(inner_shape.begin(), inner_shape.end(), int64_t{1}, std::multiplies<>());
  // Prefixes a box of one row's inner tensor with that row.
  const auto in_row = [&](int64_t row, int64_t from, int64_t to) {
    for (TensorBox box : flat_range_boxes(inner_shape, from, to)) {
      box.offsets.insert(box.offsets.begin(), row);
      box.sizes.insert(box.sizes.begin(), 1);
      boxes.push_back(std::move(box));
    }
  };
  int64_t row = begin / inner;
  const int64_t last_row = end / inner;  // the row holding `end`, if it is partial
  if (row == last_row) {
    in_row(row, begin % inner, end % inner);
    return boxes;
  }
  if (begin % inner != 0) in_row(row++, begin % inner, inner);
  if (last_row > row) {
    TensorBox full{{row}, {last_row - row}};
    for (const int64_t d : inner_shape) {
      full.offsets.push_back(0);
      full.sizes.push_back(d);
    }
    boxes.push_back(std::move(full));
  }
  if (end % inner != 0) in_row(last_row, 0, end % inner);
  return boxes;
}

bool box_inside(const TensorBox& box, const std::vector<int64_t>& shape) {
  if (box.offsets.size() != shape.size() || box.sizes.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] + box.sizes[d] > shape[d]) {
      return false;
    }
  }
  return true;
}

bool boxes_overlap(const TensorBox& a, const TensorBox& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) {
      return false;
    }
  }
  return a.numel() > 0 && b.numel() > 0;
}

void scatter_box(const float* box_data, const TensorBox& box, const std::vector<int64_t>& shape,
                 float* tensor) {
  const size_t rank = shape.size();
  if (box.numel() == 0) return;
  // Walk the box's rows (every index but the last), copying each run.
  const int64_t run = box.sizes[rank - 1];
  std::vector<int64_t> index(rank, 0);  // within the box, last dimension fixed at 0
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * shape[d] + box.offsets[d] + index[d];
    std::memcpy(tensor + flat, box_data, static_cast<size_t>(run) * sizeof(float));
    box_data += run;
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++index[d] < box.sizes[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

}  // namespace brigade

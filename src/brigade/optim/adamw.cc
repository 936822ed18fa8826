#include "brigade/optim/adamw.h"

#include <algorithm>

#include "brigade/core/error.h"
#include "brigade/kernels/cpu/vector_ops.h"

namespace brigade {

AdamW::AdamW(const AdamWConfig& config, const std::vector<DecayRange>& ranges, int64_t size)
    : AdamW(config, ranges, std::vector<Slice>{{0, size}}) {}

AdamW::AdamW(const AdamWConfig& config, const std::vector<DecayRange>& ranges,
             const std::vector<Slice>& slices)
    : config_(config), slices_(slices) {
  // Each slice meets the decay ranges in a few pieces; elements no range
  // covers (padding) are left alone.
  int64_t moment = 0;
  for (const Slice& slice : slices_) {
    BRIGADE_CHECK(slice.begin <= slice.end);
    for (const DecayRange& r : ranges) {
      const int64_t begin = std::max(slice.begin, r.begin);
      const int64_t end = std::min(slice.end, r.end);
      if (begin < end)
        pieces_.push_back({begin, moment + (begin - slice.begin), end - begin, r.decay});
    }
    moment += slice.end - slice.begin;
  }
  m_ = FloatBuffer(moment);
  v_ = FloatBuffer(moment);
}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
  step(params, grads, lr, grad_scale, {});
}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale,
                 const std::vector<StateCopy>& copies, uint64_t* hash) {
  ++step_count_;
  for (const Piece& p : pieces_) {
    const cpu::AdamWStep s{static_cast<float>(lr),
                           static_cast<float>(config_.beta1),
                           static_cast<float>(config_.beta2),
                           static_cast<float>(config_.eps),
                           p.decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                           step_count_,
                           static_cast<float>(grad_scale)};
    // The piece in runs that a copy covers or none does; the update is
    // elementwise, so cutting it changes no value.
    const auto update = [&](int64_t begin, int64_t end, const cpu::AdamWCopy& copy) {
      const int64_t moment = p.moment + (begin - p.begin);
      cpu::adamw_update(params + begin, grads + begin, m_.data() + moment, v_.data() + moment,
                        end - begin, s, copy, hash, begin);
    };
    const int64_t end = p.begin + p.n;
    int64_t at = p.begin;
    for (const StateCopy& c : copies) {
      if (c.end <= at) continue;
      if (c.begin >= end) break;
      if (c.begin > at) update(at, c.begin, {});
      const int64_t to = std::min(end, c.end);
      const int64_t shift = std::max(at, c.begin) - c.begin;
      const auto place = [shift](float* base) { return base != nullptr ? base + shift : nullptr; };
      update(std::max(at, c.begin), to, {place(c.to.params), place(c.to.m), place(c.to.v)});
      at = to;
    }
    if (at < end) update(at, end, {});
  }
}

uint64_t AdamW::state_hash(const float* params) const {
  uint64_t sum = 0;
  for (const Piece& p : pieces_) {
    sum +=
        cpu::state_hash(params + p.begin, m_.data() + p.moment, v_.data() + p.moment, p.n, p.begin);
  }
  return sum;
}

}  // namespace brigade

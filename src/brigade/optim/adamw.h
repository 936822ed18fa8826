// AdamW over a flat parameter buffer, with weight decay only where it belongs.
//
// The buffer is described as ranges, each decayed or not; the optimizer does
// not know what a "layer" is (ARCHITECTURE.md: optim/ knows nothing of who
// owns which shard). Moments m and v mirror the parameter buffer element for
// element, so a shard of parameters has the matching shard of moments.
#pragma once

#include <cstdint>
#include <vector>

#include "brigade/core/aligned_buffer.h"

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

class AdamW {
 public:
  AdamW(const AdamWConfig& config, std::vector<DecayRange> ranges, int64_t size);

  // One update with gradients grads * grad_scale (the clipping factor).
  // step_count() increments first, so the first update has bias-correction
  // step 1.
  void step(float* params, const float* grads, double lr, double grad_scale = 1.0);

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  FloatBuffer& m() { return m_; }
  FloatBuffer& v() { return v_; }
  const FloatBuffer& m() const { return m_; }
  const FloatBuffer& v() const { return v_; }

 private:
  AdamWConfig config_;
  std::vector<DecayRange> ranges_;
  FloatBuffer m_;
  FloatBuffer v_;
  int64_t step_count_ = 0;
};

}  // namespace brigade

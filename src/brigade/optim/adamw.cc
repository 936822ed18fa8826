#include "brigade/optim/adamw.h"

#include "brigade/kernels/cpu/vector_ops.h"

namespace brigade {

AdamW::AdamW(const AdamWConfig& config, std::vector<DecayRange> ranges, int64_t size)
    : config_(config), ranges_(std::move(ranges)), m_(size), v_(size) {}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
  ++step_count_;
  for (const DecayRange& r : ranges_) {
    const cpu::AdamWStep s{static_cast<float>(lr),
                           static_cast<float>(config_.beta1),
                           static_cast<float>(config_.beta2),
                           static_cast<float>(config_.eps),
                           r.decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                           step_count_,
                           static_cast<float>(grad_scale)};
    cpu::adamw_update(params + r.begin, grads + r.begin, m_.data() + r.begin, v_.data() + r.begin,
                      r.end - r.begin, s);
  }
}

}  // namespace brigade

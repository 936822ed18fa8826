// Global gradient-norm clipping over the whole flat gradient buffer.
#pragma once

#include <cstdint>

namespace brigade {

// L2 norm over n gradient elements.
double grad_norm(const float* grads, int64_t n);

// Scales grads so their norm is at most max_norm, the way
// torch.nn.utils.clip_grad_norm_ does: scale = min(1, max_norm / (norm + 1e-6)).
// Returns the scale applied (1 when no clipping happened). max_norm <= 0
// disables clipping.
double clip_grad_norm(float* grads, int64_t n, double norm, double max_norm);

}  // namespace brigade

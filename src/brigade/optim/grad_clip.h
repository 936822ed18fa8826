// Global gradient-norm clipping over the whole flat gradient buffer.
#pragma once

#include <cstdint>

namespace brigade {

// L2 norm over n gradient elements.
double grad_norm(const float* grads, int64_t n);

// The factor that brings gradients of norm `norm` to at most max_norm, the
// way torch.nn.utils.clip_grad_norm_ computes it: min(1, max_norm / (norm +
// 1e-6)); 1 when max_norm <= 0 (clipping off). The optimizer applies it while
// it reads the gradients, which saves a pass over them.
double clip_scale(double norm, double max_norm);

}  // namespace brigade

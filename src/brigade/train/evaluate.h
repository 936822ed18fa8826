// Held-out loss: the one evaluation loop behind `brigade train`'s periodic
// validation and `brigade eval`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "brigade/model/gpt.h"

namespace brigade {

class TokenShard;

struct EvalResult {
  double loss = 0.0;    // mean next-token loss, nats per token
  int64_t windows = 0;  // windows of block_size tokens evaluated
};

// Mean loss of `model` over the first `max_windows` (0: all) non-overlapping
// windows of block_size tokens in `shard`, `batch` windows per forward pass.
// `what` names the data in errors ("the validation split of runs/data").
EvalResult evaluate_windows(Gpt& model, const TokenShard& shard, int64_t batch, int64_t max_windows,
                            const std::string& what);
// The same with the model's mean loss of `b` windows (B,T) from loss_of (a
// pipeline's forward, which every stage runs together).
using WindowLoss = std::function<double(const int32_t* inputs, const int32_t* targets, int64_t b)>;
EvalResult evaluate_windows(const GptConfig& config, const WindowLoss& loss_of,
                            const TokenShard& shard, int64_t batch, int64_t max_windows,
                            const std::string& what);

}  // namespace brigade

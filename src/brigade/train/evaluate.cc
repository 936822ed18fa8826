#include "brigade/train/evaluate.h"

#include <algorithm>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "brigade/data/token_shard.h"

namespace brigade {

EvalResult evaluate_windows(Gpt& model, const TokenShard& shard, int64_t batch, int64_t max_windows,
                            const std::string& what) {
  const auto loss_of = [&](const int32_t* inputs, const int32_t* targets, int64_t b) {
    return static_cast<double>(model.forward_loss(inputs, targets, b, model.config().block_size));
  };
  return evaluate_windows(model.config(), loss_of, shard, batch, max_windows, what);
}

EvalResult evaluate_windows(const GptConfig& config, const WindowLoss& loss_of,
                            const TokenShard& shard, int64_t batch, int64_t max_windows,
                            const std::string& what) {
  const int64_t t = config.block_size;
  if (shard.vocab_size() > static_cast<uint64_t>(config.vocab_size)) {
    throw_error(
        "{} was tokenized with a vocabulary of {} but the model has {}: evaluate on data "
        "prepared with the model's tokenizer",
        what, shard.vocab_size(), config.vocab_size);
  }
  const EvalWindows windows(shard, static_cast<int>(t));
  int64_t total = static_cast<int64_t>(windows.num_windows());
  if (max_windows > 0) total = std::min(total, max_windows);
  if (total == 0) {
    throw_error("{} holds {} tokens, fewer than block_size+1 = {}: nothing to evaluate", what,
                shard.size(), t + 1);
  }
  std::vector<int32_t> inputs(static_cast<size_t>(batch * t)), targets(inputs.size());
  double sum = 0.0;
  for (int64_t w = 0; w < total; w += batch) {
    const int64_t count = std::min(batch, total - w);
    windows.fill(static_cast<uint64_t>(w), static_cast<int>(count), inputs.data(), targets.data());
    sum += loss_of(inputs.data(), targets.data(), count) * static_cast<double>(count);
  }
  return {sum / static_cast<double>(total), total};
}

}  // namespace brigade

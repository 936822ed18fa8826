// Where each training and eval sample comes from.
//
// GlobalSampler defines the global batch of step s from (seed, s) and the
// data alone: sample j of step s starts at window
//     Philox::below(key(seed, kDataOrder), /*stream=*/s, /*index=*/j, num_windows())
// of the train shards' valid windows, taken in shard order. No state carries
// from step to step, so resuming at step s needs only s, and a worker that
// owns samples [a, b) of the global batch asks for exactly those. The batch is
// the same whether one worker or sixty-four fill it, which is what lets a run
// continue on a different number of workers with the same data order.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "brigade/data/dataset.h"
#include "brigade/data/token_shard.h"

namespace brigade {

class GlobalSampler {
 public:
  // A window is seq_len + 1 consecutive tokens inside one shard: seq_len
  // inputs and the same shifted by one as targets. Throws Error if no shard
  // is long enough to hold one. The shards must outlive the sampler.
  GlobalSampler(std::span<const TokenShard> train_shards, uint64_t seed, int seq_len);
  GlobalSampler(const Dataset& dataset, uint64_t seed, int seq_len)
      : GlobalSampler(dataset.train_shards(), seed, seq_len) {}
  GlobalSampler(Dataset&&, uint64_t, int) = delete;  // would dangle

  // Writes samples [first_sample, first_sample + num_samples) of step
  // `step`'s global batch: inputs and targets are each (num_samples, seq_len)
  // row-major, targets[i][t] = the token after inputs[i][t].
  void fill(uint64_t step, uint64_t first_sample, int num_samples, int32_t* inputs,
            int32_t* targets) const;

  // Where sample `sample` of step `step` starts: (shard index, token offset).
  std::pair<size_t, uint64_t> window_start(uint64_t step, uint64_t sample) const;

  uint64_t num_windows() const { return window_ends_.empty() ? 0 : window_ends_.back(); }
  int seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }

 private:
  std::span<const TokenShard> shards_;
  uint64_t seed_;
  int seq_len_;
  // window_ends_[k]: windows in shards 0..k together (an inclusive prefix
  // sum), so shard k holds global windows [window_ends_[k-1], window_ends_[k]).
  std::vector<uint64_t> window_ends_;
};

// Sequential, non-overlapping windows over one shard (the validation split):
// window w covers tokens [w * seq_len, (w + 1) * seq_len], inputs the first
// seq_len of them, targets the last seq_len. Every eval sees the same windows
// in the same order, so losses compare across runs and checkpoints.
class EvalWindows {
 public:
  // The shard must outlive this object. A shard shorter than seq_len + 1
  // tokens has no windows; num_windows() is then 0.
  EvalWindows(const TokenShard& shard, int seq_len);

  uint64_t num_windows() const { return num_windows_; }
  int seq_len() const { return seq_len_; }

  // Writes windows [first_window, first_window + count) as (count, seq_len)
  // inputs and targets.
  void fill(uint64_t first_window, int count, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenShard* shard_;
  int seq_len_;
  uint64_t num_windows_;
};

}  // namespace brigade

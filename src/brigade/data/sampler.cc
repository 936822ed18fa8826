#include "brigade/data/sampler.h"

#include <algorithm>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"

namespace brigade {

GlobalSampler::GlobalSampler(std::span<const TokenShard> train_shards, uint64_t seed, int seq_len)
    : shards_(train_shards), seed_(seed), seq_len_(seq_len) {
  if (seq_len < 1) throw_error("block_size must be at least 1, not {}", seq_len);
  const uint64_t window_tokens = static_cast<uint64_t>(seq_len) + 1;
  uint64_t total_windows = 0, total_tokens = 0, longest_shard = 0;
  window_ends_.reserve(shards_.size());
  for (const TokenShard& shard : shards_) {
    if (shard.size() >= window_tokens) total_windows += shard.size() - window_tokens + 1;
    total_tokens += shard.size();
    longest_shard = std::max(longest_shard, shard.size());
    window_ends_.push_back(total_windows);
  }
  if (total_windows == 0) {
    if (shards_.size() <= 1) {
      throw_error(
          "the training data has {} tokens, fewer than block_size+1 = {}: use more data or a "
          "smaller block_size",
          total_tokens, window_tokens);
    }
    throw_error(
        "no training shard holds block_size+1 = {} tokens (the longest has {}): use more data "
        "per shard or a smaller block_size",
        window_tokens, longest_shard);
  }
}

std::pair<size_t, uint64_t> GlobalSampler::window_start(uint64_t step, uint64_t sample) const {
  const uint64_t window =
      Philox::below(Philox::key(seed_, RngPurpose::kDataOrder), step, sample, num_windows());
  // The first shard whose windows end past `window`; empty shards have
  // window_ends_[k] == window_ends_[k-1] and are skipped by upper_bound.
  const size_t shard =
      std::upper_bound(window_ends_.begin(), window_ends_.end(), window) - window_ends_.begin();
  const uint64_t shard_first_window = shard == 0 ? 0 : window_ends_[shard - 1];
  return {shard, window - shard_first_window};
}

void GlobalSampler::fill(uint64_t step, uint64_t first_sample, int num_samples, int32_t* inputs,
                         int32_t* targets) const {
  BRIGADE_CHECK(num_samples >= 0);
  const size_t row = static_cast<size_t>(seq_len_);
  for (int i = 0; i < num_samples; ++i) {
    const auto [shard, offset] = window_start(step, first_sample + static_cast<uint64_t>(i));
    shards_[shard].copy_window(offset, row, inputs + i * row);
    shards_[shard].copy_window(offset + 1, row, targets + i * row);
  }
}

EvalWindows::EvalWindows(const TokenShard& shard, int seq_len) : shard_(&shard), seq_len_(seq_len) {
  if (seq_len < 1) throw_error("block_size must be at least 1, not {}", seq_len);
  const uint64_t len = static_cast<uint64_t>(seq_len);
  num_windows_ = shard.size() > len ? (shard.size() - 1) / len : 0;
}

void EvalWindows::fill(uint64_t first_window, int count, int32_t* inputs, int32_t* targets) const {
  BRIGADE_CHECK(count >= 0 && first_window + static_cast<uint64_t>(count) <= num_windows_,
                "eval windows [{}, {}) of {}", first_window, first_window + count, num_windows_);
  const size_t row = static_cast<size_t>(seq_len_);
  for (int i = 0; i < count; ++i) {
    const uint64_t offset = (first_window + static_cast<uint64_t>(i)) * row;
    shard_->copy_window(offset, row, inputs + i * row);
    shard_->copy_window(offset + 1, row, targets + i * row);
  }
}

}  // namespace brigade

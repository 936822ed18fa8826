// Shape of a GPT-2-architecture model.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace brigade {

class Config;

// What the backward pass may recompute instead of keeping from the forward.
enum class Recompute {
  kNone,  // keep every block's activations: fastest, most memory
  kFull,  // keep only each block's input; rerun the block's forward in backward
  // Keep all but what attention redoes cheaply. The fused attention never
  // stores its (T,T) softmax (it keeps a log-sum-exp per row and rebuilds
  // the probabilities from q and k in backward, as FlashAttention does),
  // so Korthikanti et al.'s 5as^2b is already gone; selective also drops
  // the attention output (N,C/tp per block) and recomputes it, and lse,
  // from the kept q, k, v: one more attention forward per block.
  kSelective,
};

struct GptConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  int64_t block_size = 128;  // longest sequence (rows of the position table)
  int64_t vocab_size = 256;
  Recompute recompute = Recompute::kNone;

  int64_t head_dim() const { return n_embd / n_head; }

  // Reads [model] from a config; throws Error on values that cannot work.
  static GptConfig from_config(Config& config);
  // Throws Error naming the bad value and the fix.
  void validate() const;
  // Whether tp ranks can split the blocks Megatron's way: tp must divide
  // n_head (whole heads per rank), hence n_embd and 4 * n_embd. Throws Error
  // naming the numbers and the fix.
  void validate_tensor_parallel(int tp) const;
  // Whether sequence parallelism can split every sequence over tp ranks:
  // tp must divide block_size. Throws Error naming the numbers and the fix.
  void validate_sequence_parallel(int tp) const;

  // The five shape numbers, as stored in checkpoint metadata.
  nlohmann::json to_json() const;
  static GptConfig from_json(const nlohmann::json& j);

  // Training FLOPs per token, forward + backward, not counting recompute
  // (the convention behind MFU): 6 * matmul parameters + the attention
  // score and value products, 12 * n_layer * n_embd * T.
  double train_flops_per_token(int64_t seq_len) const;
  int64_t num_params() const;
};

const char* recompute_name(Recompute r);

}  // namespace brigade

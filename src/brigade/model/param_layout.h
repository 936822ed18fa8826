// Where each parameter lives in the one flat buffer (ARCHITECTURE.md,
// decision 1). Names and shapes are Hugging Face GPT-2's, matrices stored
// (in, out) as its Conv1D does, so a checkpoint is a plain dump of this
// layout and GPT-2 weights from elsewhere load without transposes.
//
// Order: wte, wpe, then for each block h.{i}.{ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias}, then ln_f.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/model/gpt_config.h"

namespace brigade {

enum class ParamKind {
  kMatmul,  // a GEMM weight: weight decay applies
  kTokenEmbedding,
  kPositionEmbedding,
  kBias,
  kNorm,  // LayerNorm weight or bias
};

struct ParamInfo {
  std::string name;            // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // e.g. {768, 2304}
  int64_t offset = 0;          // first element in the flat buffer
  int64_t numel = 0;
  ParamKind kind = ParamKind::kMatmul;
};

// Offsets of one block's tensors, for the forward/backward code.
struct BlockOffsets {
  int64_t ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
  int64_t ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
};

class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  // Total floats in the flat buffer (each tensor starts 64-byte aligned;
  // the few padding floats stay zero).
  int64_t size() const { return size_; }
  int64_t num_params() const { return num_params_; }
  const ParamInfo* find(const std::string& name) const;

  int64_t wte() const { return params_[0].offset; }
  int64_t wpe() const { return params_[1].offset; }
  const BlockOffsets& block(int64_t layer) const { return blocks_[layer]; }
  int64_t ln_f_w() const { return ln_f_w_; }
  int64_t ln_f_b() const { return ln_f_b_; }

 private:
  int64_t add(std::string name, std::vector<int64_t> shape, ParamKind kind);

  std::vector<ParamInfo> params_;
  std::vector<BlockOffsets> blocks_;
  int64_t size_ = 0;
  int64_t num_params_ = 0;
  int64_t ln_f_w_ = 0, ln_f_b_ = 0;
};

}  // namespace brigade

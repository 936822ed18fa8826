#include "brigade/model/param_layout.h"

#include <fmt/format.h>

namespace brigade {
namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes: one cache line, one AVX-512 vector
}

int64_t ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamKind kind) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t offset = size_;
  params_.push_back({std::move(name), std::move(shape), offset, numel, kind});
  size_ += (numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  num_params_ += numel;
  return offset;
}

ParamLayout::ParamLayout(const GptConfig& cfg) {
  const int64_t c = cfg.n_embd;
  add("wte.weight", {cfg.vocab_size, c}, ParamKind::kTokenEmbedding);
  add("wpe.weight", {cfg.block_size, c}, ParamKind::kPositionEmbedding);
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    BlockOffsets b{};
    b.ln_1_w = add(p + "ln_1.weight", {c}, ParamKind::kNorm);
    b.ln_1_b = add(p + "ln_1.bias", {c}, ParamKind::kNorm);
    b.c_attn_w = add(p + "attn.c_attn.weight", {c, 3 * c}, ParamKind::kMatmul);
    b.c_attn_b = add(p + "attn.c_attn.bias", {3 * c}, ParamKind::kBias);
    b.attn_proj_w = add(p + "attn.c_proj.weight", {c, c}, ParamKind::kMatmul);
    b.attn_proj_b = add(p + "attn.c_proj.bias", {c}, ParamKind::kBias);
    b.ln_2_w = add(p + "ln_2.weight", {c}, ParamKind::kNorm);
    b.ln_2_b = add(p + "ln_2.bias", {c}, ParamKind::kNorm);
    b.c_fc_w = add(p + "mlp.c_fc.weight", {c, 4 * c}, ParamKind::kMatmul);
    b.c_fc_b = add(p + "mlp.c_fc.bias", {4 * c}, ParamKind::kBias);
    b.mlp_proj_w = add(p + "mlp.c_proj.weight", {4 * c, c}, ParamKind::kMatmul);
    b.mlp_proj_b = add(p + "mlp.c_proj.bias", {c}, ParamKind::kBias);
    blocks_.push_back(b);
  }
  ln_f_w_ = add("ln_f.weight", {c}, ParamKind::kNorm);
  ln_f_b_ = add("ln_f.bias", {c}, ParamKind::kNorm);
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace brigade

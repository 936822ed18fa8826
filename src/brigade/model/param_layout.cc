#include "brigade/model/param_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade {
namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes: one cache line, one AVX-512 vector
}

int64_t ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamKind kind,
                         int split_dim, int64_t parts) {
  ParamInfo info;
  info.name = std::move(name);
  info.global_shape = shape;
  info.kind = kind;
  if (tp_size_ > 1 && split_dim >= 0) {
    // Run p of the global dimension is [p*G/parts, (p+1)*G/parts); this
    // rank owns the tp_rank-th 1/tp of each run, rounded up (only the
    // vocabulary may not divide: its last rows are then padding).
    const auto d = static_cast<size_t>(split_dim);
    const int64_t global_run = shape[d] / parts;
    const int64_t run = (global_run + tp_size_ - 1) / tp_size_;
    info.split_dim = split_dim;
    for (int64_t p = 0; p < parts; ++p)
      info.part_offsets.push_back(p * global_run + tp_rank_ * run);
    shape[d] = run * parts;
  }
  info.shape = std::move(shape);
  info.numel = 1;
  for (int64_t d : info.shape) info.numel *= d;
  info.offset = size_;
  size_ += (info.numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  num_params_ += info.numel;
  params_.push_back(std::move(info));
  return params_.back().offset;
}

ParamLayout::ParamLayout(const GptConfig& cfg, int tp_rank, int tp_size, LayerRange layers)
    : first_layer_(layers.begin),
      end_layer_(layers.end < 0 ? cfg.n_layer : layers.end),
      n_layer_(cfg.n_layer),
      tp_rank_(tp_rank),
      tp_size_(tp_size) {
  BRIGADE_CHECK(tp_rank >= 0 && tp_rank < tp_size, "tp rank out of range");
  BRIGADE_CHECK(first_layer_ >= 0 && first_layer_ < end_layer_ && end_layer_ <= cfg.n_layer,
                "layer range [{}, {}) is not a non-empty part of {} layers", first_layer_,
                end_layer_, cfg.n_layer);
  cfg.validate_tensor_parallel(tp_size);
  const int64_t c = cfg.n_embd;
  if (has_embeddings() || has_head()) {
    // Vocabulary-parallel: this rank's rows of the tied embedding / LM head
    // (the same rows on the first and the last pipeline stage).
    wte_ = add("wte.weight", {cfg.vocab_size, c}, ParamKind::kTokenEmbedding, 0);
    ParamInfo& wte = params_.back();
    wte.tied_copy = !has_embeddings();
    vocab_rows_ = wte.shape[0];
    vocab_begin_ = wte.replicated() ? 0 : wte.part_offsets[0];
    vocab_valid_ = wte.replicated() ? vocab_rows_ : wte.run_extent(0);
  }
  if (has_embeddings())
    wpe_ = add("wpe.weight", {cfg.block_size, c}, ParamKind::kPositionEmbedding);
  for (int64_t i = first_layer_; i < end_layer_; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    BlockOffsets b{};
    b.ln_1_w = add(p + "ln_1.weight", {c}, ParamKind::kNorm);
    b.ln_1_b = add(p + "ln_1.bias", {c}, ParamKind::kNorm);
    // Column-parallel: this rank's heads of q, k and v (three runs each).
    b.c_attn_w = add(p + "attn.c_attn.weight", {c, 3 * c}, ParamKind::kMatmul, 1, 3);
    b.c_attn_b = add(p + "attn.c_attn.bias", {3 * c}, ParamKind::kBias, 0, 3);
    // Row-parallel: the rows that read this rank's heads; the bias is whole.
    b.attn_proj_w = add(p + "attn.c_proj.weight", {c, c}, ParamKind::kMatmul, 0);
    b.attn_proj_b = add(p + "attn.c_proj.bias", {c}, ParamKind::kBias);
    b.ln_2_w = add(p + "ln_2.weight", {c}, ParamKind::kNorm);
    b.ln_2_b = add(p + "ln_2.bias", {c}, ParamKind::kNorm);
    b.c_fc_w = add(p + "mlp.c_fc.weight", {c, 4 * c}, ParamKind::kMatmul, 1);
    b.c_fc_b = add(p + "mlp.c_fc.bias", {4 * c}, ParamKind::kBias, 0);
    b.mlp_proj_w = add(p + "mlp.c_proj.weight", {4 * c, c}, ParamKind::kMatmul, 0);
    b.mlp_proj_b = add(p + "mlp.c_proj.bias", {c}, ParamKind::kBias);
    blocks_.push_back(b);
  }
  if (has_head()) {
    ln_f_w_ = add("ln_f.weight", {c}, ParamKind::kNorm);
    ln_f_b_ = add("ln_f.bias", {c}, ParamKind::kNorm);
  }
  parts_ = {{first_layer_, end_layer_}};
  part_offsets_ = {0};
}

ParamLayout::ParamLayout(const GptConfig& cfg, int tp_rank, int tp_size,
                         const std::vector<LayerRange>& parts)
    : ParamLayout(cfg, tp_rank, tp_size, parts.empty() ? LayerRange{} : parts.front()) {
  for (size_t k = 1; k < parts.size(); ++k) {
    const ParamLayout part(cfg, tp_rank, tp_size, parts[k]);
    BRIGADE_CHECK(part.first_layer_ >= end_layer_, "layer ranges must ascend: [{}, {}) after {}",
                  part.first_layer_, part.end_layer_, end_layer_);
    // Every tensor's size is rounded to the alignment, so the base is aligned.
    const int64_t base = size_;
    for (ParamInfo info : part.params_) {
      info.offset += base;
      params_.push_back(std::move(info));
    }
    const auto shifted = [base](int64_t offset) { return offset < 0 ? offset : offset + base; };
    if (wte_ < 0 && part.wte_ >= 0) {
      wte_ = shifted(part.wte_);
      vocab_rows_ = part.vocab_rows_;
      vocab_begin_ = part.vocab_begin_;
      vocab_valid_ = part.vocab_valid_;
    }
    if (part.ln_f_w_ >= 0) {
      ln_f_w_ = shifted(part.ln_f_w_);
      ln_f_b_ = shifted(part.ln_f_b_);
    }
    // Blocks between the parts are not here: their offsets stay -1.
    blocks_.resize(static_cast<size_t>(part.first_layer_ - first_layer_),
                   BlockOffsets{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
    for (BlockOffsets b : part.blocks_) {
      for (int64_t* o :
           {&b.ln_1_w, &b.ln_1_b, &b.c_attn_w, &b.c_attn_b, &b.attn_proj_w, &b.attn_proj_b,
            &b.ln_2_w, &b.ln_2_b, &b.c_fc_w, &b.c_fc_b, &b.mlp_proj_w, &b.mlp_proj_b}) {
        *o = shifted(*o);
      }
      blocks_.push_back(b);
    }
    end_layer_ = part.end_layer_;
    size_ += part.size_;
    num_params_ += part.num_params_;
    parts_.push_back({part.first_layer_, part.end_layer_});
    part_offsets_.push_back(base);
  }
}

int64_t ParamInfo::run_extent(size_t part) const {
  const auto d = static_cast<size_t>(split_dim);
  const auto parts = static_cast<int64_t>(part_offsets.size());
  const int64_t run = shape[d] / parts;
  const int64_t global_run_end = (static_cast<int64_t>(part) + 1) * (global_shape[d] / parts);
  return std::clamp<int64_t>(global_run_end - part_offsets[part], 0, run);
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

namespace {
template <typename Copy>
void for_each_shared_run(const ParamLayout& local_layout, const ParamLayout& global_layout,
                         Copy&& copy) {
  BRIGADE_CHECK(global_layout.tp_size() == 1 && global_layout.whole(),
                "local_to_global/global_to_local need a rank's layout and the whole model's");
  // A part's tensors are a run of the whole model's, in the same order;
  // in a layout of several parts the search wraps (the last stage's tied
  // wte follows its first part's blocks).
  const auto& all = global_layout.params();
  size_t k = 0;
  for (const ParamInfo& l : local_layout.params()) {
    size_t found = all.size();
    for (size_t i = 0; i < all.size() && found == all.size(); ++i) {
      if (all[(k + i) % all.size()].name == l.name) found = (k + i) % all.size();
    }
    BRIGADE_CHECK(found < all.size(), "{} is not in the whole model", l.name);
    k = found;
    const int64_t g = global_layout.params()[k].offset;
    l.for_each_run([&](int64_t local, int64_t global, int64_t count) {
      copy(l.offset + local, g + global, count);
    });
  }
}
}  // namespace

void local_to_global(const ParamLayout& local_layout, const ParamLayout& global_layout,
                     const float* local, float* global) {
  for_each_shared_run(local_layout, global_layout, [&](int64_t l, int64_t g, int64_t n) {
    std::copy(local + l, local + l + n, global + g);
  });
}

void global_to_local(const ParamLayout& local_layout, const ParamLayout& global_layout,
                     const float* global, float* local) {
  for_each_shared_run(local_layout, global_layout, [&](int64_t l, int64_t g, int64_t n) {
    std::copy(global + g, global + g + n, local + l);
  });
}

}  // namespace brigade

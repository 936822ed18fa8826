// Where each parameter lives in the one flat buffer (ARCHITECTURE.md,
// decision 1). Names and shapes are Hugging Face GPT-2's, matrices stored
// (in, out) as its Conv1D does, so a checkpoint is a plain dump of this
// layout and GPT-2 weights from elsewhere load without transposes.
//
// Order: wte, wpe, then for each block h.{i}.{ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias}, then ln_f.
//
// Under tensor parallelism (tp ranks) a rank's layout holds its shards only
// (Megatron's split): attn.c_attn and mlp.c_fc are cut by output columns,
// their biases alike (column-parallel); attn.c_proj.weight and
// mlp.c_proj.weight by input rows (row-parallel); wte, the tied embedding
// and LM head, by vocabulary rows (vocabulary-parallel); everything else
// (wpe, LayerNorms, the row-parallel biases, ln_f) is replicated. The order
// and names stay, so every tp rank's buffer has the same size and the same
// tensor boundaries, and buckets and ZeRO slices line up across them.
//
// A vocabulary that tp does not divide is padded to the next multiple of
// tp: every rank holds ceil(V/tp) rows, the last rows of the last rank(s)
// are padding. Only to a multiple of tp, not of 64*tp as Megatron-LM does
// for its GPU GEMM tiles: these CPU GEMMs run any row count at the same
// speed, and each padding row costs a logit column per token. Padding rows
// are no part of the global tensor (for_each_run skips them, so
// checkpoints hold the true V rows); they stay zero, and the model masks
// their logits, so they change neither the loss nor any gradient.
//
// A pipeline stage's layout (a LayerRange) holds only its part of the
// model, in the same order: wte if the part has the embeddings or the LM
// head (they share it; under tp both stages hold the same vocabulary rows),
// wpe with the embeddings, its blocks, ln_f with the head. Names stay
// global, so checkpoints and loads go by name.
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
  std::string name;                   // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;         // this rank's tensor, e.g. {768, 2304}
  std::vector<int64_t> global_shape;  // the whole tensor (equal to shape when replicated)
  int64_t offset = 0;                 // first element in the flat buffer
  int64_t numel = 0;                  // of this rank's tensor
  ParamKind kind = ParamKind::kMatmul;
  // Where this rank's tensor lies in the global one. split_dim < 0: it is
  // the whole tensor (replicated on every tp rank). Otherwise, along
  // split_dim the local tensor is part_offsets.size() equal runs, and run p
  // starts at global index part_offsets[p]; the other dimensions are whole.
  // Indices of a run past the end of the global tensor are padding (the
  // vocabulary-parallel wte's last rows): run_extent says how many are real.
  // (c_attn has three runs, this rank's heads of q, of k and of v, since
  // Hugging Face stores q, k, v side by side in one (C,3C) matrix.)
  int split_dim = -1;
  std::vector<int64_t> part_offsets;
  // The LM head's copy of the tied wte in a part without the embeddings
  // (the last pipeline stage): the embeddings' part owns the tensor, writes
  // it to checkpoints and counts it in the gradient norm.
  bool tied_copy = false;

  bool replicated() const { return split_dim < 0; }
  // Indices of run `part` along split_dim that exist in the global tensor
  // (the run's length, less padding; 0 for a run all padding).
  int64_t run_extent(size_t part) const;
  // Calls fn(local, global, count) for runs that together cover the tensor
  // once: elements [local, local+count) of this rank's row-major tensor are
  // elements [global, global+count) of the row-major global tensor.
  template <typename Fn>
  void for_each_run(Fn&& fn) const;
};

// Offsets of one block's tensors, for the forward/backward code.
struct BlockOffsets {
  int64_t ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
  int64_t ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
};

// Blocks [begin, end) of the model (end < 0: through the last), with the
// embeddings when begin is 0 and ln_f and the LM head when end is n_layer.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = -1;
};

class ParamLayout {
 public:
  // tp_rank's shards of a model split over tp_size ranks (1: the whole model),
  // of the blocks in `layers`. Error naming the numbers and the fix if
  // tp_size does not divide the heads, n_embd and 4 * n_embd.
  explicit ParamLayout(const GptConfig& config, int tp_rank = 0, int tp_size = 1,
                       LayerRange layers = {});
  // Several parts in one buffer, one after another (the model chunks of an
  // interleaved pipeline stage): part k's tensors are those of
  // ParamLayout(config, tp_rank, tp_size, parts[k]), moved up by
  // part_offset(k). The parts are disjoint and in ascending order; block()
  // answers for the blocks they hold, wte() is the first part's that has it.
  ParamLayout(const GptConfig& config, int tp_rank, int tp_size,
              const std::vector<LayerRange>& parts);

  const std::vector<ParamInfo>& params() const { return params_; }
  // Total floats in the flat buffer (each tensor starts 64-byte aligned;
  // the few padding floats stay zero).
  int64_t size() const { return size_; }
  int64_t num_params() const { return num_params_; }
  const ParamInfo* find(const std::string& name) const;

  // Offsets of tensors this part may lack: -1 when absent.
  int64_t wte() const { return wte_; }
  int64_t wpe() const { return wpe_; }
  // `layer` is the model's index, in [first_layer(), end_layer()).
  const BlockOffsets& block(int64_t layer) const { return blocks_[layer - first_layer_]; }
  int64_t first_layer() const { return first_layer_; }
  int64_t end_layer() const { return end_layer_; }
  bool has_embeddings() const { return first_layer_ == 0; }
  bool has_head() const { return end_layer_ == n_layer_; }
  bool whole() const { return has_embeddings() && has_head() && parts_.size() == 1; }
  int64_t ln_f_w() const { return ln_f_w_; }
  int64_t ln_f_b() const { return ln_f_b_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  // The parts (one unless built from several) and where each starts.
  const std::vector<LayerRange>& parts() const { return parts_; }
  int64_t part_offset(size_t k) const { return part_offsets_[k]; }
  // This rank's rows of wte: global token ids [vocab_begin, vocab_begin +
  // vocab_valid) are local rows [0, vocab_valid); rows [vocab_valid,
  // vocab_rows) are padding.
  int64_t vocab_begin() const { return vocab_begin_; }
  int64_t vocab_rows() const { return vocab_rows_; }
  int64_t vocab_valid() const { return vocab_valid_; }

 private:
  // split_dim < 0: replicated; else cut along split_dim into `parts` runs
  // (1, or 3 for c_attn's q, k, v), each divided among the tp ranks.
  int64_t add(std::string name, std::vector<int64_t> shape, ParamKind kind, int split_dim = -1,
              int64_t parts = 1);

  std::vector<ParamInfo> params_;
  std::vector<BlockOffsets> blocks_;
  int64_t size_ = 0;
  int64_t num_params_ = 0;
  int64_t ln_f_w_ = -1, ln_f_b_ = -1;
  int64_t wte_ = -1, wpe_ = -1;
  int64_t first_layer_ = 0, end_layer_ = 0, n_layer_ = 0;
  int tp_rank_ = 0, tp_size_ = 1;
  int64_t vocab_begin_ = 0, vocab_rows_ = 0, vocab_valid_ = 0;
  std::vector<LayerRange> parts_;
  std::vector<int64_t> part_offsets_;
};

// Copies a rank's tensors (`local`, laid out by local_layout) into their
// places in a buffer of the whole model (laid out by global_layout), or the
// other way round. The layouts are of the same model; global_layout's tp size
// is 1 and it is whole; local_layout may be any part (tensors match by name).
void local_to_global(const ParamLayout& local_layout, const ParamLayout& global_layout,
                     const float* local, float* global);
void global_to_local(const ParamLayout& local_layout, const ParamLayout& global_layout,
                     const float* global, float* local);

template <typename Fn>
void ParamInfo::for_each_run(Fn&& fn) const {
  if (replicated()) {
    fn(int64_t{0}, int64_t{0}, numel);
    return;
  }
  // Elements per index of split_dim (the dimensions after it), and how many
  // leading slabs (the dimensions before it) repeat the pattern.
  int64_t inner = 1, outer = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int>(d) > split_dim) inner *= shape[d];
    if (static_cast<int>(d) < split_dim) outer *= shape[d];
  }
  const int64_t local_dim = shape[static_cast<size_t>(split_dim)];
  const int64_t global_dim = global_shape[static_cast<size_t>(split_dim)];
  const int64_t run = local_dim / static_cast<int64_t>(part_offsets.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t p = 0; p < part_offsets.size(); ++p) {
      const int64_t extent = run_extent(p);
      if (extent == 0) continue;
      fn((o * local_dim + static_cast<int64_t>(p) * run) * inner,
         (o * global_dim + part_offsets[p]) * inner, extent * inner);
    }
  }
}

}  // namespace brigade

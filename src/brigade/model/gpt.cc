// The GPT model: its forward and backward, whole and by parts (a range of
// blocks for a pipeline stage, the backward split into its input and
// weight halves, the LM head deferred), over one workspace. Over 600 lines:
// every path reads and writes the same workspace, stash and slots, and
// splitting them would pass most of that state through new interfaces.
#include "brigade/model/gpt.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "brigade/core/trace.h"
#include "brigade/kernels/cpu/attention.h"
#include "brigade/kernels/cpu/embedding.h"
#include "brigade/kernels/cpu/gelu.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/layernorm.h"
#include "brigade/kernels/cpu/linear.h"
#include "brigade/kernels/cpu/lm_head_loss.h"

namespace brigade {

// Activations one block keeps for its backward pass.
// Cl = C/tp and Hl = H/tp: this tensor-parallel rank's columns and heads
// (C and H without tensor parallelism). Nr: the token rows held here, N,
// or N/tp under sequence parallelism (this rank's run of the B*T rows).
struct Gpt::Stash {
  float* ln1;        // (Nr,C) ln_1 output, input of c_attn (gathered first under sp)
  float* ln1_mean;   // (Nr)
  float* ln1_rstd;   // (Nr)
  float* qkv;        // (N,3Cl) this rank's heads of q, then of k, then of v
  float* attn;       // (N,Cl) attention output, input of attn.c_proj
  float* lse;        // (B,Hl,T)
  float* resid_mid;  // (Nr,C) x + attn.c_proj(...), input of ln_2
  float* ln2;        // (Nr,C)
  float* ln2_mean;   // (Nr)
  float* ln2_rstd;   // (Nr)
  float* fc_pre;     // (N,4Cl) c_fc output before GELU
};

struct Gpt::Workspace {
  int64_t b = 0, t = 0;
  int threads = 0;
  // With Recompute::kNone one stash per block; with kFull a single stash
  // that every block overwrites in turn; with kSelective one per block,
  // but all share one attn and lse, which backward recomputes from qkv.
  std::vector<Stash> stashes;
  std::vector<float*> resid;    // L+1 of (Nr,C): resid[l] is block first+l's input
  std::vector<int32_t> tokens;  // (B,T): the inputs, kept for a part's embedding backward
  float* lnf;                   // (Nr,C)
  float* lnf_mean;              // (Nr)
  float* lnf_rstd;              // (Nr)
  float* losses;                // (N)
  // Scratch, live only inside one layer's forward or backward.
  float* c_a;     // (N,C)
  float* c_b;     // (N,C)
  float* c3;      // (N,3Cl)
  float* c4_a;    // (N,4Cl)
  float* c4_b;    // (N,4Cl)
  float* dresid;  // (Nr,C)
  // Sequence parallelism only (else empty): a gathered (N,C) tensor, a
  // reduce-scattered (Nr,C) one, and this micro-batch's LayerNorm
  // gradients before their sum over the tp group (4C).
  float* full;
  float* shard;
  float* ln_grads;
  float* attention_scratch;  // attention_scratch_floats(T, threads)
  float* lm_head_scratch;    // lm_head_scratch_floats(N, V)
};

void Gpt::WorkspaceDeleter::operator()(Workspace* w) const {
  delete w;
}

Gpt::Gpt(const GptConfig& config, float* params, float* grads, TensorParallel* tp,
         LayerRange layers)
    : config_(config),
      layout_(config, tp ? tp->rank() : 0, tp ? tp->size() : 1, layers),
      params_(params),
      grads_(grads),
      tp_(tp) {
  config_.validate();
}

const Gpt::Stash& Gpt::stash(int64_t layer) const {
  return config_.recompute == Recompute::kFull
             ? ws_->stashes[0]
             : ws_->stashes[static_cast<size_t>(layer - layout_.first_layer())];
}

float* Gpt::resid(int64_t layer) const {
  return ws_->resid[static_cast<size_t>(layer - layout_.first_layer())];
}

namespace {

// Carves named views out of one allocation; each view 64-byte aligned.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t floats) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (floats + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

// sp: sequence parallelism (then tp > 1 and tp divides t). layers: the part's blocks.
template <typename Ws, typename StashT>
void carve(Carver& cv, Ws& ws, const GptConfig& cfg, int64_t tp, bool sp, int64_t layers, int64_t b,
           int64_t t) {
  const int64_t n = b * t, c = cfg.n_embd, cl = c / tp;
  const int64_t nr = sp ? n / tp : n;
  const int64_t num_stashes = cfg.recompute == Recompute::kFull ? 1 : layers;
  const bool selective = cfg.recompute == Recompute::kSelective;
  float* shared_attn = selective ? cv.take(n * cl) : nullptr;
  float* shared_lse = selective ? cv.take(b * (cfg.n_head / tp) * t) : nullptr;
  ws.stashes.assign(num_stashes, StashT{});
  for (StashT& s : ws.stashes) {
    s.ln1 = cv.take(nr * c);
    s.ln1_mean = cv.take(nr);
    s.ln1_rstd = cv.take(nr);
    s.qkv = cv.take(n * 3 * cl);
    s.attn = selective ? shared_attn : cv.take(n * cl);
    s.lse = selective ? shared_lse : cv.take(b * (cfg.n_head / tp) * t);
    s.resid_mid = cv.take(nr * c);
    s.ln2 = cv.take(nr * c);
    s.ln2_mean = cv.take(nr);
    s.ln2_rstd = cv.take(nr);
    s.fc_pre = cv.take(n * 4 * cl);
  }
  ws.resid.assign(static_cast<size_t>(layers + 1), nullptr);
  for (float*& r : ws.resid) r = cv.take(nr * c);
  ws.lnf = cv.take(nr * c);
  ws.lnf_mean = cv.take(nr);
  ws.lnf_rstd = cv.take(nr);
  ws.losses = cv.take(n);
  ws.c_a = cv.take(n * c);
  ws.c_b = cv.take(n * c);
  ws.c3 = cv.take(n * 3 * cl);
  ws.c4_a = cv.take(n * 4 * cl);
  ws.c4_b = cv.take(n * 4 * cl);
  ws.dresid = cv.take(nr * c);
  ws.full = cv.take(sp ? n * c : 0);
  ws.shard = cv.take(sp ? nr * c : 0);
  ws.ln_grads = cv.take(sp ? 4 * c : 0);
  ws.attention_scratch = cv.take(cpu::attention_scratch_floats(t, omp_get_max_threads()));
  // Vocabulary-parallel: this rank's rows of the vocabulary, ceil(V/tp).
  const int64_t vl = (cfg.vocab_size + tp - 1) / tp;
  ws.lm_head_scratch = cv.take(cpu::lm_head_scratch_floats(n, vl));
}

// An id outside [0, vocab) would read or write outside the embedding table.
void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw_error("{} id {} at position {} is outside the model's vocabulary of {}", what, ids[i],
                  i, vocab);
    }
  }
}

}  // namespace

int64_t Gpt::activation_bytes(int64_t b, int64_t t) const {
  Workspace ws;
  Carver cv(nullptr);
  carve<Workspace, Stash>(cv, ws, config_, tp_size(), sp_, num_layers(), b, t);
  int64_t floats = cv.used();
  // A split backward keeps, from a slot's input half to its weight half,
  // each block's linear layers' output gradients and the head's dlogits.
  if (split_backward_) {
    floats += num_layers() * deferred_floats_per_block(b * t);
    if (layout_.has_head()) floats += b * t * head_vocab_rows();
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t Gpt::deferred_floats_per_block(int64_t n) const {
  const int64_t c = config_.n_embd, cl = c / tp_size();
  return n * (2 * c + 7 * cl);
}

void Gpt::ensure_workspace(int64_t b, int64_t t) {
  if (t > config_.block_size) {
    throw_error("sequence length {} exceeds the model's block_size {}", t, config_.block_size);
  }
  if (sp_ && t % tp_size() != 0) {
    throw_error(
        "sequence parallelism splits each sequence over the {} tp ranks, but the sequence "
        "length {} is not a multiple of {}: use a length divisible by parallel.tp or set "
        "parallel.sequence_parallel = false",
        tp_size(), t, tp_size());
  }
  if (slots_.size() <= slot_) slots_.resize(slot_ + 1);
  Slot& slot = slots_[slot_];
  ws_ = slot.ws.get();
  // The attention scratch is sized per thread, so a new thread count re-carves.
  if (ws_ && ws_->b == b && ws_->t == t && ws_->threads == omp_get_max_threads()) return;
  slot.ws.reset(new Workspace);
  ws_ = slot.ws.get();
  Carver sizer(nullptr);
  carve<Workspace, Stash>(sizer, *ws_, config_, tp_size(), sp_, num_layers(), b, t);
  if (slot.arena.size() < sizer.used()) slot.arena = FloatBuffer(sizer.used());
  Carver cv(slot.arena.data());
  carve<Workspace, Stash>(cv, *ws_, config_, tp_size(), sp_, num_layers(), b, t);
  ws_->b = b;
  ws_->t = t;
  ws_->threads = omp_get_max_threads();
}

void Gpt::set_sequence_parallel(bool on) {
  sp_ = on && tp_size() > 1;
  slots_.clear();
  slot_ = 0;
  ws_ = nullptr;
}

const float* Gpt::gather_rows(const float* mine, int64_t n) const {
  if (!sp_) return mine;
  tp_->all_gather(mine, ws_->full, n / tp_size() * config_.n_embd);
  return ws_->full;
}

const float* Gpt::sum_rows(float* partial, int64_t n) const {
  if (!sp_) {
    tp_sum(partial, n * config_.n_embd);
    return partial;
  }
  tp_->reduce_scatter_sum(partial, ws_->shard, n / tp_size() * config_.n_embd);
  return ws_->shard;
}

void Gpt::sum_norm_grads(int64_t count, std::initializer_list<int64_t> offsets) {
  // Each rank's share (its rows') of the LayerNorm gradients, summed over
  // the group, joins the gradient buffer, the same on every rank.
  tp_->all_reduce_sum(ws_->ln_grads, count);
  const int64_t c = config_.n_embd;
  int64_t k = 0;
  for (const int64_t offset : offsets) {
    float* g = grads_ + offset;
    const float* add = ws_->ln_grads + k * c;
    for (int64_t i = 0; i < c; ++i) g[i] += add[i];
    ++k;
  }
}

const float* Gpt::block_forward(int64_t layer, const Stash& s, const float* resid_in, int64_t b,
                                int64_t t) {
  const BlockOffsets& o = layout_.block(layer);
  const float* p = params_;
  const int64_t n = b * t, c = config_.n_embd, cl = c / tp_size(), nr = rows_here(n);
  const int64_t hl = config_.n_head / tp_size();
  // A row-parallel layer's bias joins the sum once: on tp rank 0.
  const bool adds_row_bias = tp_ == nullptr || tp_->rank() == 0;
  Workspace& ws = *ws_;
  // qkv (N,3Cl) = ln1 @ c_attn.weight (C,3Cl) + bias: column-parallel, on
  // all N rows (gathered from the tp ranks under sequence parallelism).
  cpu::linear_forward(s.qkv, gather_rows(s.ln1, n), p + o.c_attn_w, p + o.c_attn_b, n, c, 3 * cl);
  // Hl heads of C/H each: the same head size as the unsplit model.
  cpu::attention_forward(s.attn, s.lse, s.qkv, b, t, cl, hl, ws.attention_scratch);
  // c_a (N,C) = sum over tp of attn (N,Cl) @ attn.c_proj.weight (Cl,C), + bias: row-parallel.
  cpu::linear_forward(ws.c_a, s.attn, p + o.attn_proj_w,
                      adds_row_bias ? p + o.attn_proj_b : nullptr, n, cl, c);
  const float* attn_out = sum_rows(ws.c_a, n);  // (Nr,C)
  // resid_mid = resid_in + attn_out;  ln2 = LayerNorm(resid_mid)
  cpu::residual_layernorm_forward(s.resid_mid, s.ln2, s.ln2_mean, s.ln2_rstd, resid_in, attn_out,
                                  p + o.ln_2_w, p + o.ln_2_b, nr, c);
  // fc_pre (N,4Cl) = ln2 @ c_fc.weight (C,4Cl) + bias;  c4_a = gelu(fc_pre)
  cpu::linear_forward(s.fc_pre, gather_rows(s.ln2, n), p + o.c_fc_w, p + o.c_fc_b, n, c, 4 * cl);
  cpu::gelu_forward(ws.c4_a, s.fc_pre, n * 4 * cl);
  // c_b (N,C) = sum over tp of c4_a (N,4Cl) @ mlp.c_proj.weight (4Cl,C), + bias
  cpu::linear_forward(ws.c_b, ws.c4_a, p + o.mlp_proj_w, adds_row_bias ? p + o.mlp_proj_b : nullptr,
                      n, 4 * cl, c);
  return sum_rows(ws.c_b, n);
}

Gpt::Range Gpt::embeddings_range() const {
  return {layout_.wte(), layout_.block(0).ln_1_w};
}
Gpt::Range Gpt::wte_range() const {
  return {layout_.wte(), layout_.params()[1].offset};  // wte is first wherever it is
}
Gpt::Range Gpt::block_range(int64_t layer) const {
  const int64_t end = layer + 1 < layout_.end_layer() ? layout_.block(layer + 1).ln_1_w
                      : layout_.has_head()            ? layout_.ln_f_w()
                                                      : layout_.size();
  return {layout_.block(layer).ln_1_w, end};
}
Gpt::Range Gpt::ln_f_range() const {
  return {layout_.ln_f_w(), layout_.size()};
}

void Gpt::forward_trunk(const int32_t* inputs, const float* resid_in, int64_t b, int64_t t) {
  ensure_workspace(b, t);
  Workspace& ws = *ws_;
  const float* p = params_;
  const int64_t n = b * t, c = config_.n_embd, v = config_.vocab_size, nr = rows_here(n);
  const int64_t first = layout_.first_layer(), end = layout_.end_layer();
  const bool head = layout_.has_head();
  // Residency (ZeRO 3): each step holds what it reads and fetches the next
  // block meanwhile. Block l's closing LayerNorm belongs to block l+1 (or
  // ln_f), so that range is acquired before block l runs and kept for its own turn.
  if (layout_.has_embeddings()) {
    check_token_ids(inputs, n, v, "token");
    acquire(embeddings_range());
    acquire(block_range(first));
    embed(inputs, b, t);
  } else {
    acquire(block_range(first));
    std::memcpy(resid(first), resid_in, sizeof(float) * nr * c);
  }
  const BlockOffsets& first_block = layout_.block(first);
  cpu::layernorm_forward(stash(first).ln1, stash(first).ln1_mean, stash(first).ln1_rstd,
                         resid(first), p + first_block.ln_1_w, p + first_block.ln_1_b, nr, c);
  if (layout_.has_embeddings()) release(embeddings_range());
  for (int64_t l = first; l < end; ++l) {
    const trace::Scope span("compute", "block forward", l);
    const Stash& s = stash(l);
    const bool last = l + 1 == end;
    if (!last) {
      acquire(block_range(l + 1));
      if (l + 2 < end) prefetch(block_range(l + 2));
    } else if (head) {
      acquire(ln_f_range());
      prefetch(wte_range());  // the LM head's
    }
    const float* mlp_out = block_forward(l, s, resid(l), b, t);
    if (last && !head) {
      // The part's output stream; the next part's first block normalises it.
      float* out = resid(l + 1);
#pragma omp parallel for schedule(static) if (nr * c >= (1 << 16))
      for (int64_t i = 0; i < nr * c; ++i) out[i] = s.resid_mid[i] + mlp_out[i];
      release(block_range(l));
      break;
    }
    // The block's closing residual add is fused with the next LayerNorm:
    // resid[l+1] = resid_mid + mlp_out, then ln_1 of block l+1 (or ln_f).
    const Stash& next_stash = stash(last ? l : l + 1);
    const BlockOffsets* nb = last ? nullptr : &layout_.block(l + 1);
    cpu::residual_layernorm_forward(resid(l + 1), last ? ws.lnf : next_stash.ln1,
                                    last ? ws.lnf_mean : next_stash.ln1_mean,
                                    last ? ws.lnf_rstd : next_stash.ln1_rstd, s.resid_mid, mlp_out,
                                    p + (last ? layout_.ln_f_w() : nb->ln_1_w),
                                    p + (last ? layout_.ln_f_b() : nb->ln_1_b), nr, c);
    release(block_range(l));
  }
  // ln_f stays acquired: its backward (or end_forward_only) releases it.
}

void Gpt::end_forward_only() {
  release(ln_f_range());
}

void Gpt::block_backward(int64_t layer, const Stash& s, const float* resid_in, float* dresid,
                         int64_t b, int64_t t, const Deferred* keep) {
  const BlockOffsets& o = layout_.block(layer);
  const float* p = params_;
  float* g = grads_;
  const int64_t n = b * t, c = config_.n_embd, cl = c / tp_size(), nr = rows_here(n);
  const int64_t hl = config_.n_head / tp_size();
  Workspace& ws = *ws_;
  // Input gradient only when the weight half comes later: dout is kept
  // (copied, unless the kernel before already wrote it where it is kept).
  const auto linear_bwd = [&](float* din, float* dw, float* db, const float* dout, const float* in,
                              const float* w, int64_t k, int64_t o, float* kept) {
    if (kept == nullptr) {
      cpu::linear_backward(din, dw, db, dout, in, w, n, k, o, /*accumulate_din=*/false);
      return;
    }
    if (kept != dout) std::memcpy(kept, dout, sizeof(float) * n * o);
    cpu::gemm(false, true, n, k, o, 1.0f, dout, o, w, o, 0.0f, din, k);
  };
  // Under sequence parallelism each rank's LayerNorm gradients cover its
  // rows only: they collect in ln_grads (ln_1 w, b, ln_2 w, b) and are
  // summed over the group at the end.
  if (sp_) std::memset(ws.ln_grads, 0, sizeof(float) * 4 * c);
  float* dln1_w = sp_ ? ws.ln_grads : g + o.ln_1_w;
  float* dln1_b = sp_ ? ws.ln_grads + c : g + o.ln_1_b;
  float* dln2_w = sp_ ? ws.ln_grads + 2 * c : g + o.ln_2_w;
  float* dln2_b = sp_ ? ws.ln_grads + 3 * c : g + o.ln_2_b;
  // dresid holds dL/d(block output) for the rows here, the same on every tp
  // rank without sequence parallelism. The MLP branch, last op first, on all
  // N rows (gathered under sequence parallelism: the backward of the
  // forward's reduce-scatter). The row-parallel bias gradient is then whole
  // here, as on one process, so every tp rank's copy gets the same gradient.
  const float* dmlp = gather_rows(dresid, n);
  if (keep == nullptr) {
    // dc4 (N,4Cl) = dmlp @ mlp.c_proj.weight^T first; then one pass rebuilds
    // the activation for the weight gradient (cheaper than storing it) and
    // turns dc4 into dL/d(fc_pre), from one tanh per element.
    cpu::gemm(false, true, n, 4 * cl, c, 1.0f, dmlp, c, p + o.mlp_proj_w, c, 0.0f, ws.c4_b, 4 * cl);
    cpu::gelu_forward_backward(ws.c4_a, ws.c4_b, ws.c4_b, s.fc_pre, n * 4 * cl);
    cpu::linear_backward(nullptr, g + o.mlp_proj_w, g + o.mlp_proj_b, dmlp, ws.c4_a,
                         p + o.mlp_proj_w, n, 4 * cl, c, /*accumulate_din=*/false);
  } else {
    linear_bwd(ws.c4_b, g + o.mlp_proj_w, g + o.mlp_proj_b, dmlp, ws.c4_a, p + o.mlp_proj_w, 4 * cl,
               c, keep->mlp_proj);
    // dL/d(fc_pre) straight into the weight half's keep: the split
    // backward's input half (the pipeline's critical path) copies less.
    cpu::gelu_backward(keep->c_fc, ws.c4_b, s.fc_pre, n * 4 * cl);
  }
  const float* dfc = keep ? keep->c_fc : ws.c4_b;
  linear_bwd(ws.c_a, g + o.c_fc_w, g + o.c_fc_b, dfc, keep ? nullptr : gather_rows(s.ln2, n),
             p + o.c_fc_w, c, 4 * cl, keep ? keep->c_fc : nullptr);
  // dL/d(ln2): each rank had its columns' share; summed (or reduce-scattered).
  const float* dln2 = sum_rows(ws.c_a, n);
  // dresid += ln_2 backward: now dL/d(resid_mid).
  cpu::layernorm_backward(dresid, dln2_w, dln2_b, dln2, s.resid_mid, s.ln2_mean, s.ln2_rstd,
                          p + o.ln_2_w, nr, c);
  // The attention branch. Selective recompute kept q, k, v but not the
  // attention output: rebuild it (and lse) from them.
  if (config_.recompute == Recompute::kSelective) {
    cpu::attention_forward(s.attn, s.lse, s.qkv, b, t, cl, hl, ws.attention_scratch);
  }
  linear_bwd(ws.c_a, g + o.attn_proj_w, g + o.attn_proj_b, gather_rows(dresid, n), s.attn,
             p + o.attn_proj_w, cl, c, keep ? keep->attn_proj : nullptr);
  float* dqkv = keep ? keep->c_attn : ws.c3;  // kept in place, as dL/d(fc_pre)
  cpu::attention_backward(dqkv, ws.c_a, s.qkv, s.attn, s.lse, b, t, cl, hl, ws.attention_scratch);
  linear_bwd(ws.c_a, g + o.c_attn_w, g + o.c_attn_b, dqkv, keep ? nullptr : gather_rows(s.ln1, n),
             p + o.c_attn_w, c, 3 * cl, keep ? keep->c_attn : nullptr);
  const float* dln1 = sum_rows(ws.c_a, n);  // dL/d(ln1)
  // dresid += ln_1 backward: now dL/d(block input).
  cpu::layernorm_backward(dresid, dln1_w, dln1_b, dln1, resid_in, s.ln1_mean, s.ln1_rstd,
                          p + o.ln_1_w, nr, c);
  if (sp_) sum_norm_grads(4 * c, {o.ln_1_w, o.ln_1_b, o.ln_2_w, o.ln_2_b});
}

void Gpt::block_weight_backward(int64_t layer, const Stash& s, const Deferred& kept, int64_t b,
                                int64_t t) {
  const BlockOffsets& o = layout_.block(layer);
  float* g = grads_;
  const int64_t n = b * t, c = config_.n_embd, cl = c / tp_size();
  // What linear_backward adds, from the kept output gradients.
  const auto weight_grad = [&](float* dw, float* db, const float* dout, const float* in, int64_t k,
                               int64_t o_features) {
    cpu::gemm(true, false, k, o_features, n, 1.0f, in, k, dout, o_features, 1.0f, dw, o_features);
    cpu::add_column_sums(db, dout, n, o_features);
  };
  cpu::gelu_forward(ws_->c4_a, s.fc_pre, n * 4 * cl);
  weight_grad(g + o.mlp_proj_w, g + o.mlp_proj_b, kept.mlp_proj, ws_->c4_a, 4 * cl, c);
  weight_grad(g + o.c_fc_w, g + o.c_fc_b, kept.c_fc, gather_rows(s.ln2, n), c, 4 * cl);
  // Selective recompute: the shared attention output holds another block's by now.
  if (config_.recompute == Recompute::kSelective) {
    cpu::attention_forward(s.attn, s.lse, s.qkv, b, t, cl, config_.n_head / tp_size(),
                           ws_->attention_scratch);
  }
  weight_grad(g + o.attn_proj_w, g + o.attn_proj_b, kept.attn_proj, s.attn, cl, c);
  weight_grad(g + o.c_attn_w, g + o.c_attn_b, kept.c_attn, gather_rows(s.ln1, n), c, 3 * cl);
}

float Gpt::forward_backward(const int32_t* inputs, const int32_t* targets, int64_t b, int64_t t,
                            float loss_scale) {
  BRIGADE_CHECK(grads_ != nullptr, "forward_backward needs a gradient buffer");
  BRIGADE_CHECK(layout_.whole(), "forward_backward runs the whole model; a part runs part_forward");
  check_token_ids(targets, b * t, config_.vocab_size, "target");
  forward_trunk(inputs, nullptr, b, t);
  head_loss_backward(targets, loss_scale);
  backward_trunk(inputs, /*from_head=*/true);
  return mean_loss(b * t);
}

void Gpt::head_loss_backward(const int32_t* targets, float loss_scale) {
  Workspace& ws = *ws_;
  const int64_t n = ws.b * ws.t;
  const trace::Scope span("compute", "lm head and loss");
  cpu::LmHeadLossArgs head = lm_head_args(gather_rows(ws.lnf, n), targets, n);
  head.dx = ws.c_a;
  head.loss_scale = loss_scale;
  Slot& slot = slots_[slot_];
  if (split_backward_) {
    if (slot.head_dlogits.size() < n * head.v) slot.head_dlogits = FloatBuffer(n * head.v);
    head.dlogits = slot.head_dlogits.data();
    slot.head_weight_pending = true;
  } else {
    head.dwte = grads_ + layout_.wte();
  }
  acquire(wte_range());
  prefetch(block_range(layout_.end_layer() - 1));
  cpu::lm_head_loss(head);
  release(wte_range());
}

void Gpt::head_weight_backward() {
  Slot& slot = slots_[slot_];
  if (!slot.head_weight_pending) return;
  const trace::Scope span("compute", "lm head weight");
  const int64_t n = ws_->b * ws_->t;
  // Under sequence parallelism ln_f's output is gathered again (its forward
  // gather went to scratch since reused).
  const float* x = gather_rows(ws_->lnf, n);
  acquire(wte_range());
  // The forward's row chunks (the same n, v and requested rows give the
  // same chunks): the same sum, bit for bit.
  cpu::lm_head_weight_grad(grads_ + layout_.wte(), slot.head_dlogits.data(), x, n, config_.n_embd,
                           head_vocab_rows(), head_chunk_rows_);
  release(wte_range());
  slot.head_weight_pending = false;
}

void Gpt::backward_trunk(const int32_t* inputs, bool from_head, bool defer) {
  Workspace& ws = *ws_;
  // Whether this pass reports gradients: the weight half does when deferred.
  const bool report = !defer && grad_ready_;
  const float* p = params_;
  float* g = grads_;
  const int64_t b = ws.b, t = ws.t, n = b * t, c = config_.n_embd, nr = rows_here(n);
  const int64_t first = layout_.first_layer(), end = layout_.end_layer();
  if (from_head) {
    // Vocabulary-parallel: each rank's columns' share of dL/d(ln_f), summed
    // (reduce-scattered to the rows here under sequence parallelism).
    const float* dlnf = sum_rows(ws.c_a, n);
    std::memset(ws.dresid, 0, sizeof(float) * nr * c);
    if (sp_) std::memset(ws.ln_grads, 0, sizeof(float) * 2 * c);
    cpu::layernorm_backward(ws.dresid, sp_ ? ws.ln_grads : g + layout_.ln_f_w(),
                            sp_ ? ws.ln_grads + c : g + layout_.ln_f_b(), dlnf, resid(end),
                            ws.lnf_mean, ws.lnf_rstd, p + layout_.ln_f_w(), nr, c);
    if (sp_) sum_norm_grads(2 * c, {layout_.ln_f_w(), layout_.ln_f_b()});
    release(ln_f_range());
    if (report) grad_ready_(layout_.ln_f_w());
  }
  Slot& slot = slots_[slot_];
  if (defer) {
    BRIGADE_CHECK(config_.recompute != Recompute::kFull, "a split backward needs every stash");
    const int64_t cl = c / tp_size(), per_block = deferred_floats_per_block(n);
    if (slot.deferred_arena.size() < per_block * num_layers()) {
      slot.deferred_arena = FloatBuffer(per_block * num_layers());
    }
    slot.deferred.clear();
    for (int64_t l = 0; l < num_layers(); ++l) {
      float* base = slot.deferred_arena.data() + l * per_block;
      slot.deferred.push_back(
          {base, base + n * c, base + n * (c + 4 * cl), base + n * (2 * c + 4 * cl)});
    }
  }
  for (int64_t l = end - 1; l >= first; --l) {
    const trace::Scope span("compute", defer ? "block backward input" : "block backward", l);
    const Stash& s = stash(l);
    acquire(block_range(l));
    if (l > first) prefetch(block_range(l - 1));
    if (config_.recompute == Recompute::kFull) {
      // Rebuild this block's stash from its saved input: ln_1, then the rest.
      const BlockOffsets& o = layout_.block(l);
      cpu::layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, resid(l), p + o.ln_1_w, p + o.ln_1_b,
                             nr, c);
      block_forward(l, s, resid(l), b, t);
    }
    block_backward(l, s, resid(l), ws.dresid, b, t,
                   defer ? &slot.deferred[static_cast<size_t>(l - first)] : nullptr);
    release(block_range(l));
    if (report) grad_ready_(layout_.block(l).ln_1_w);
  }
  if (defer) return;  // the embedding's gradient is the weight half's
  head_weight_backward();
  if (layout_.has_embeddings()) embedding_backward(inputs, b, t);
  if (grad_ready_) grad_ready_(0);
}

void Gpt::embedding_backward(const int32_t* inputs, int64_t b, int64_t t) {
  float* g = grads_;
  const int64_t n = b * t, c = config_.n_embd;
  if (tp_size() == 1) {
    cpu::embedding_backward(g + layout_.wte(), g + layout_.wpe(), ws_->dresid, inputs, b, t, c);
    return;
  }
  // Every rank has (or gathers) the whole dL/d(embedding output): its rows
  // of wte take their tokens' share, and wpe (replicated) the same sum everywhere.
  const float* dembed = gather_rows(ws_->dresid, n);
  cpu::token_embedding_backward(g + layout_.wte(), dembed, inputs, layout_.vocab_begin(),
                                layout_.vocab_valid(), n, c);
  cpu::position_embedding_backward(g + layout_.wpe(), dembed, b, t, c);
}

float Gpt::part_forward(int64_t slot, const int32_t* inputs, const float* resid_in,
                        const int32_t* targets, float loss_scale, float* resid_out, int64_t b,
                        int64_t t) {
  BRIGADE_CHECK(grads_ != nullptr && slot >= 0, "part_forward needs a gradient buffer");
  const int64_t n = b * t, c = config_.n_embd;
  if (layout_.has_head()) check_token_ids(targets, n, config_.vocab_size, "target");
  slot_ = static_cast<size_t>(slot);
  forward_trunk(inputs, resid_in, b, t);
  if (layout_.has_embeddings()) ws_->tokens.assign(inputs, inputs + n);
  float loss = 0.0f;
  if (layout_.has_head() && loss_scale == 0.0f) {
    // Evaluation: every gradient would be zero, so the loss alone.
    acquire(wte_range());
    cpu::lm_head_loss(lm_head_args(gather_rows(ws_->lnf, n), targets, n));
    release(wte_range());
    end_forward_only();
    loss = mean_loss(n);
  } else if (layout_.has_head()) {
    head_loss_backward(targets, loss_scale);
    loss = mean_loss(n);
  } else {
    std::memcpy(resid_out, resid(layout_.end_layer()), sizeof(float) * rows_here(n) * c);
  }
  slot_ = 0;
  return loss;
}

void Gpt::select_slot(int64_t slot) {
  BRIGADE_CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[slot].ws,
                "a backward of slot {} before its part_forward", slot);
  slot_ = static_cast<size_t>(slot);
  ws_ = slots_[slot_].ws.get();
}

void Gpt::part_backward_input(int64_t slot, const float* dresid_out, float* dresid_in) {
  select_slot(slot);
  const int64_t rows = rows_here(ws_->b * ws_->t), c = config_.n_embd;
  if (!layout_.has_head()) std::memcpy(ws_->dresid, dresid_out, sizeof(float) * rows * c);
  backward_trunk(ws_->tokens.data(), layout_.has_head(), /*defer=*/true);
  if (!layout_.has_embeddings()) std::memcpy(dresid_in, ws_->dresid, sizeof(float) * rows * c);
  slot_ = 0;
}

void Gpt::part_backward_weight(int64_t slot) {
  select_slot(slot);
  Slot& s = slots_[slot_];
  BRIGADE_CHECK(!s.deferred.empty(), "part_backward_weight of slot {} before its input half", slot);
  const int64_t b = ws_->b, t = ws_->t, first = layout_.first_layer();
  if (grad_ready_ && layout_.has_head()) grad_ready_(layout_.ln_f_w());
  for (int64_t l = layout_.end_layer() - 1; l >= first; --l) {
    const trace::Scope span("compute", "block backward weight", l);
    block_weight_backward(l, stash(l), s.deferred[static_cast<size_t>(l - first)], b, t);
    if (grad_ready_) grad_ready_(layout_.block(l).ln_1_w);
  }
  // The head's wte (offset 0) last: the blocks' buckets can go meanwhile.
  head_weight_backward();
  if (layout_.has_embeddings()) embedding_backward(ws_->tokens.data(), b, t);
  if (grad_ready_) grad_ready_(0);
  s.deferred.clear();
  slot_ = 0;
}

void Gpt::part_backward(int64_t slot, const float* dresid_out, float* dresid_in) {
  select_slot(slot);
  const int64_t rows = rows_here(ws_->b * ws_->t), c = config_.n_embd;
  if (!layout_.has_head()) std::memcpy(ws_->dresid, dresid_out, sizeof(float) * rows * c);
  backward_trunk(ws_->tokens.data(), layout_.has_head());
  if (!layout_.has_embeddings()) std::memcpy(dresid_in, ws_->dresid, sizeof(float) * rows * c);
  slot_ = 0;
}

void Gpt::embed(const int32_t* inputs, int64_t b, int64_t t) {
  Workspace& ws = *ws_;
  const float* p = params_;
  const int64_t n = b * t, c = config_.n_embd;
  if (tp_size() == 1) {
    cpu::embedding_forward(ws.resid[0], inputs, p + layout_.wte(), p + layout_.wpe(), b, t, c);
    return;
  }
  // Vocabulary-parallel: each rank looks up the tokens it holds (zero rows
  // for the others); the sum over the group is the whole lookup (this
  // rank's rows of it under sequence parallelism), then the positions.
  float* lookup = sp_ ? ws.c_a : ws.resid[0];
  cpu::token_embedding_forward(lookup, inputs, p + layout_.wte(), layout_.vocab_begin(),
                               layout_.vocab_valid(), n, c);
  const int64_t nr = rows_here(n);
  if (sp_) {
    tp_->reduce_scatter_sum(lookup, ws.resid[0], nr * c);
  } else {
    tp_->all_reduce_sum(lookup, n * c);
  }
  cpu::position_embedding_add(ws.resid[0], p + layout_.wpe(), sp_ ? tp_->rank() * nr : 0, nr, t, c);
}

void Gpt::combine_head_stats(float* stats, int64_t rows) const {
  // Every rank's (max, sum-exp, target logit) per row, gathered; each rank
  // combines them in rank order, so all get bit-identical results. One
  // gather of 3 floats a row replaces an all-reduce of the max and then
  // one of the sums.
  const int tp = tp_size();
  std::vector<float> all(static_cast<size_t>(3 * rows * tp));
  tp_->all_gather(stats, all.data(), 3 * rows);
  for (int64_t r = 0; r < rows; ++r) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int k = 0; k < tp; ++k) mx = std::max(mx, all[static_cast<size_t>((k * rows + r) * 3)]);
    float sum = 0.0f, target = 0.0f;
    for (int k = 0; k < tp; ++k) {
      const float* st = all.data() + (k * rows + r) * 3;
      if (st[1] > 0.0f) sum += st[1] * std::exp(st[0] - mx);
      target += st[2];
    }
    stats[3 * r] = mx;
    stats[3 * r + 1] = sum;
    stats[3 * r + 2] = target;
  }
}

void Gpt::head_logits(const float* x, int64_t rows, float* logits) const {
  const int64_t c = config_.n_embd, v = config_.vocab_size;
  if (tp_size() == 1) {
    cpu::lm_head_logits(logits, x, params_ + layout_.wte(), rows, c, v);
    return;
  }
  // Each rank's columns, gathered and put side by side, padding left out.
  const int64_t vl = layout_.vocab_rows();
  const int tp = tp_size();
  std::vector<float> mine(static_cast<size_t>(rows * vl));
  std::vector<float> all(static_cast<size_t>(rows * vl * tp));
  cpu::lm_head_logits(mine.data(), x, params_ + layout_.wte(), rows, c, vl);
  tp_->all_gather(mine.data(), all.data(), rows * vl);
  for (int k = 0; k < tp; ++k) {
    const int64_t begin = k * vl, count = std::clamp<int64_t>(v - begin, 0, vl);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = all.data() + (k * rows + r) * vl;
      std::copy(src, src + count, logits + r * v + begin);
    }
  }
}

cpu::LmHeadLossArgs Gpt::lm_head_args(const float* x, const int32_t* targets, int64_t n) const {
  cpu::LmHeadLossArgs head;
  head.x = x;
  head.wte = params_ + layout_.wte();
  head.targets = targets;
  head.n = n;
  head.c = config_.n_embd;
  head.v = head_vocab_rows();
  head.losses = ws_->losses;
  head.scratch = ws_->lm_head_scratch;
  head.chunk_rows = head_chunk_rows_;
  if (tp_size() > 1) {
    head.v_real = layout_.vocab_valid();
    head.vocab_begin = layout_.vocab_begin();
    head.combine = [this](float* stats, int64_t rows) { combine_head_stats(stats, rows); };
  }
  return head;
}

float Gpt::mean_loss(int64_t n) const {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += ws_->losses[i];
  return static_cast<float>(total / static_cast<double>(n));
}

float Gpt::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t b, int64_t t) {
  BRIGADE_CHECK(layout_.whole(), "forward_loss runs the whole model");
  check_token_ids(targets, b * t, config_.vocab_size, "target");
  forward_trunk(inputs, nullptr, b, t);
  acquire(wte_range());
  cpu::lm_head_loss(lm_head_args(gather_rows(ws_->lnf, b * t), targets, b * t));
  release(wte_range());
  end_forward_only();
  return mean_loss(b * t);
}

void Gpt::forward_logits(const int32_t* inputs, int64_t b, int64_t t, float* logits) {
  BRIGADE_CHECK(layout_.whole(), "forward_logits runs the whole model");
  forward_trunk(inputs, nullptr, b, t);
  acquire(wte_range());
  head_logits(gather_rows(ws_->lnf, b * t), b * t, logits);
  release(wte_range());
  end_forward_only();
}

void Gpt::forward_last_logits(const int32_t* inputs, int64_t b, int64_t t, float* logits) {
  BRIGADE_CHECK(layout_.whole(), "forward_last_logits runs the whole model");
  forward_trunk(inputs, nullptr, b, t);
  acquire(wte_range());
  const int64_t c = config_.n_embd;
  const float* x = gather_rows(ws_->lnf, b * t);
  for (int64_t row = 0; row < b; ++row) {
    head_logits(x + (row * t + t - 1) * c, 1, logits + row * config_.vocab_size);
  }
  release(wte_range());
  end_forward_only();
}

void init_gpt2_weights(const ParamLayout& layout, int64_t n_layer, uint64_t seed, float* params) {
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer));
  const uint64_t init_key = Philox::key(seed, RngPurpose::kWeightInit);
  BRIGADE_CHECK(layout.parts().size() == 1, "a layout of {} parts: initialise each part",
                layout.parts().size());
  const auto& infos = layout.params();
  // A part's tensors draw as the whole model's: by their index there (wte,
  // wpe, then the blocks' tensors in order, then ln_f).
  const auto leading = static_cast<size_t>((layout.wte() >= 0) + (layout.wpe() >= 0));
  constexpr size_t per_block = sizeof(BlockOffsets) / sizeof(int64_t);  // tensors per block
  for (size_t local_k = 0; local_k < infos.size(); ++local_k) {
    const ParamInfo& info = infos[local_k];
    const uint64_t k =
        local_k < leading
            ? (info.name == "wte.weight" ? 0 : 1)
            : 2 + per_block * static_cast<size_t>(layout.first_layer()) + (local_k - leading);
    float* dst = params + info.offset;
    if (info.kind == ParamKind::kBias || info.kind == ParamKind::kNorm) {
      const bool is_norm_weight = info.kind == ParamKind::kNorm && info.name.ends_with(".weight");
      std::fill(dst, dst + info.numel, is_norm_weight ? 1.0f : 0.0f);
      continue;
    }
    const bool residual_proj = info.name.ends_with("c_proj.weight");
    const float std_dev = residual_proj ? residual_std : 0.02f;
    if (!info.replicated()) {
      // A shard: each element from its global index (Philox draws pairs).
      info.for_each_run([&](int64_t local, int64_t global, int64_t count) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < count; ++i) {
          const auto g = static_cast<uint64_t>(global + i);
          dst[local + i] = Philox::normal2(init_key, k, g / 2)[g % 2] * std_dev;
        }
      });
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < (info.numel + 1) / 2; ++i) {
      const auto z = Philox::normal2(init_key, k, static_cast<uint64_t>(i));
      dst[2 * i] = z[0] * std_dev;
      if (2 * i + 1 < info.numel) dst[2 * i + 1] = z[1] * std_dev;
    }
  }
}

}  // namespace brigade

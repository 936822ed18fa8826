// The GPT-2 forward and backward passes over one flat parameter buffer
// (ARCHITECTURE.md decisions 1 and 2). No autograd: each layer is an explicit
// kernel pair from kernels/cpu, and this class only sequences them and owns
// the activation stash.
//
// Notation: B micro-batch rows, T sequence length, C = n_embd, H = n_head,
// V = vocab_size, L = n_layer, N = B*T token rows.
//
// Tensor parallelism (Megatron-LM's split over the tp ranks of a
// TensorParallel handle; param_layout.h says which tensors are cut): each
// rank runs H/tp heads and 4C/tp of the MLP's columns. attn.c_attn and
// mlp.c_fc are column-parallel (their input is the whole replicated
// LayerNorm output, their output this rank's columns); attn.c_proj and
// mlp.c_proj are row-parallel (each rank's partial product of all C
// outputs, summed by one all-reduce in forward, the bias added once). In
// backward the column-parallel layers' input gradients are partial sums:
// one all-reduce each. So two all-reduces of (N,C) per block each way.
// The tied embedding / LM head is vocabulary-parallel: each rank looks up
// the tokens in its rows of wte (one all-reduce of the (N,C) embedding) and
// computes its columns of the logits, chunk by chunk; per row the max, the
// sum-exp and the target logit are combined over the group (one all-gather
// of 3 floats a row per chunk), and the head's input gradient is summed
// (one all-reduce). wpe, the LayerNorms and ln_f run replicated on every tp
// rank, on bit-identical inputs, so their gradients agree without
// communication.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"
#include "brigade/model/tensor_parallel.h"

namespace brigade {
namespace cpu {
struct LmHeadLossArgs;
}

// Where parameters come from when not all of them stay in memory (ZeRO 3,
// parallel/sharded_params.h). The model brackets every read of a parameter
// range with acquire and release, and names the range it will read next
// with prefetch, so the owner can fetch it while this one computes. Ranges
// are flat offsets [begin, end). The sequence of calls is the same on every
// rank for the same forward/backward, which collectives need.
class ParamResidency {
 public:
  virtual ~ParamResidency() = default;
  virtual void prefetch(int64_t begin, int64_t end) = 0;
  virtual void acquire(int64_t begin, int64_t end) = 0;
  virtual void release(int64_t begin, int64_t end) = 0;
};

class Gpt {
 public:
  // params and grads point at flat buffers of layout().size() floats, owned
  // by the caller; grads may be null for an inference-only model. tp: the
  // tensor-parallel group this rank splits the blocks with (null, or size
  // 1: the whole model here); it must outlive the model, and the layout is
  // then this rank's shards (ParamLayout(config, tp->rank(), tp->size())).
  // layers: the blocks this model holds (a part of the model: see
  // part_forward); the default is all of them.
  Gpt(const GptConfig& config, float* params, float* grads, TensorParallel* tp = nullptr,
      LayerRange layers = {});

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }

  // One micro-batch: forward, loss, backward. inputs and targets are (B,T).
  // Gradients are ADDED to grads (so micro-batches accumulate); they are the
  // gradient of loss_scale * (sum of the B*T per-token losses), so with
  // loss_scale = 1/(rows in the global batch) the micro-batches add up to
  // the gradient of the global mean loss. Returns this micro-batch's mean loss.
  float forward_backward(const int32_t* inputs, const int32_t* targets, int64_t b, int64_t t,
                         float loss_scale);

  // A part of the model (layout().first_layer() to end_layer()), one
  // micro-batch at a time, with several micro-batches between their forward
  // and their backward: each keeps its activations in its own `slot`
  // (0, 1, ...; slots are allocated on first use and reused). The part
  // reads the residual stream (B,T,C) from resid_in, or embeds `inputs`
  // when it has the embeddings (it keeps them for the embedding's
  // backward); it writes its output stream to resid_out, or, when it has
  // the LM head, computes the loss of `targets` and its gradient (scaled
  // as in forward_backward) and returns the mean loss (0 otherwise).
  // part_backward then takes dL/d(output stream) (unused with the head) and
  // writes dL/d(input stream) to dresid_in (unused with the embeddings),
  // adding the parameters' gradients to grads. The whole model is the part
  // with both ends, and forward then backward of one slot is forward_backward.
  // A zero loss_scale (evaluation) computes the head's loss only: no backward follows.
  // Under sequence parallelism the streams are this tp rank's N/tp rows.
  float part_forward(int64_t slot, const int32_t* inputs, const float* resid_in,
                     const int32_t* targets, float loss_scale, float* resid_out, int64_t b,
                     int64_t t);
  void part_backward(int64_t slot, const float* dresid_out, float* dresid_in);
  // ZB-H1's split of part_backward (Qi et al. 2024): the input half
  // computes dresid_in, the gradient the previous stage waits for (and the
  // LayerNorms' small gradients), and keeps each linear layer's output
  // gradient in the slot; the weight half, run later, adds the linear
  // layers' weight and bias gradients and the embedding's. The grad-ready
  // hook fires in the weight half. Not with recompute = full (the stash is
  // shared by the blocks).
  void part_backward_input(int64_t slot, const float* dresid_out, float* dresid_in);
  void part_backward_weight(int64_t slot);
  // Set by whoever runs the split backward (the model still knows no
  // stages). The LM head's backward runs inside part_forward, fused with
  // the loss (its logits are never all kept); with this on, part_forward
  // computes the loss and the head's input gradient there but keeps the
  // slot's dlogits (N x V/tp floats) instead of adding the head's wte
  // gradient, a (V,C) GEMM over all N rows; part_backward_weight adds it,
  // as ZB-H1's W has it (part_backward too, so a whole backward stays
  // whole). activation_bytes then counts what a slot keeps between its two
  // halves: the dlogits and every block's linear layers' output gradients.
  void set_split_backward(bool on) { split_backward_ = on; }
  // Rows per chunk of the head's kernel (0: the kernel's own choice); tests
  // set it small so that chunk boundaries are crossed.
  void set_head_chunk_rows(int64_t rows) { head_chunk_rows_ = rows; }

  // Called during backward as gradients become final: every gradient at a
  // flat offset >= ready_from has been fully written for this micro-batch.
  // Offsets only go down (ln_f, then the blocks from last to first, then the
  // embeddings, ending at 0), so data parallelism can start reducing the tail
  // of the gradient buffer while backward still runs.
  using GradReadyHook = std::function<void(int64_t ready_from)>;
  // Applies to later forward_backward calls; an empty hook turns it off.
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

  // Null (the default): every parameter is always resident.
  void set_param_residency(ParamResidency* residency) { residency_ = residency; }

  // Mean loss over the B*T positions, no gradients.
  float forward_loss(const int32_t* inputs, const int32_t* targets, int64_t b, int64_t t);

  // logits (B,T,V) for every position.
  void forward_logits(const int32_t* inputs, int64_t b, int64_t t, float* logits);
  // logits (B,V) of the last position only (sampling).
  void forward_last_logits(const int32_t* inputs, int64_t b, int64_t t, float* logits);

  // Bytes of activation memory a (B,T) micro-batch needs, stash and scratch
  // (and, with the head's weight gradient deferred, its kept dlogits).
  int64_t activation_bytes(int64_t b, int64_t t) const;

  int tp_size() const { return tp_ ? tp_->size() : 1; }

  // Sequence parallelism (Korthikanti et al. 2022; off by default, and
  // without effect when tp_size() is 1): the LayerNorms, residual adds and
  // the embedding output hold N/tp of the B*T token rows on each tp rank
  // (rank r the r-th run of them: for B = 1 a run of the sequence). Each
  // block's all-reduces become an all-gather of the LayerNorm output before
  // the column-parallel product and a reduce-scatter after the row-parallel
  // one; backward the mirror image, the LayerNorm outputs gathered again
  // rather than stored whole. The LayerNorm gradients are then partial per
  // rank: each block sums them over the group (4C floats) before they are
  // final, so they stay replicated. The sequence length must be a multiple
  // of tp_size(). Call before a pass: it drops the activation workspace.
  void set_sequence_parallel(bool on);
  bool sequence_parallel() const { return sp_; }

 private:
  struct Stash;      // one block's saved activations
  struct Workspace;  // all activation memory for one (B,T)

  // The current slot's workspace for (B,T), allocated if need be.
  void ensure_workspace(int64_t b, int64_t t);
  // Embedding (or the stream from resid_in) and this part's blocks; leaves
  // ln_f's output (with the head) or the output stream in the workspace.
  void forward_trunk(const int32_t* inputs, const float* resid_in, int64_t b, int64_t t);
  // The head after forward_trunk: loss and its gradient (into c_a), dwte
  // (or, deferred, the dlogits for head_weight_backward).
  void head_loss_backward(const int32_t* targets, float loss_scale);
  // The current slot's deferred dwte, if its forward left one.
  void head_weight_backward();
  // ln_f's backward from c_a into dresid, then the blocks last to first,
  // then the embedding's with `inputs` (with the embeddings).
  // With `defer`, the input half only (part_backward_input).
  void backward_trunk(const int32_t* inputs, bool from_head, bool defer = false);
  void select_slot(int64_t slot);     // an allocated one, for a backward
  float* resid(int64_t layer) const;  // the input of block `layer` (or of ln_f)
  int64_t num_layers() const { return layout_.end_layer() - layout_.first_layer(); }
  // Block `layer`'s forward from its residual input, up to the MLP output.
  // Returns the MLP's output rows here (a workspace buffer).
  const float* block_forward(int64_t layer, const Stash& s, const float* resid_in, int64_t b,
                             int64_t t);
  // One block's linear layers' output gradients, kept by a split backward.
  struct Deferred {
    float *mlp_proj, *c_fc, *attn_proj, *c_attn;  // (N,C) (N,4Cl) (N,C) (N,3Cl)
  };
  // Floats of one block's Deferred for n token rows: N (2C + 7Cl).
  int64_t deferred_floats_per_block(int64_t n) const;
  // With `keep`, only the input gradients: the linear layers' output
  // gradients go to *keep for block_weight_backward.
  void block_backward(int64_t layer, const Stash& s, const float* resid_in, float* dresid,
                      int64_t b, int64_t t, const Deferred* keep = nullptr);
  void block_weight_backward(int64_t layer, const Stash& s, const Deferred& kept, int64_t b,
                             int64_t t);
  const Stash& stash(int64_t layer) const;
  // The LM head's arguments for the forward pass just run (no gradients).
  // x: ln_f's output, all N rows.
  cpu::LmHeadLossArgs lm_head_args(const float* x, const int32_t* targets, int64_t n) const;
  // wte's rows here: the vocabulary, or under tp this rank's padded share.
  int64_t head_vocab_rows() const {
    return tp_size() > 1 ? layout_.vocab_rows() : config_.vocab_size;
  }
  // The token + position embedding of `inputs` into resid[0].
  void embed(const int32_t* inputs, int64_t b, int64_t t);
  // wte's and wpe's gradients from dresid, dL/d(embedding output).
  void embedding_backward(const int32_t* inputs, int64_t b, int64_t t);
  // The LM head's combine under vocabulary parallelism (lm_head_loss.h).
  void combine_head_stats(float* stats, int64_t rows) const;
  // logits (rows,V) of x (rows,C), the whole vocabulary (gathered under tp).
  void head_logits(const float* x, int64_t rows, float* logits) const;
  // Mean of the per-row losses the LM head just wrote.
  float mean_loss(int64_t n) const;

  GptConfig config_;
  ParamLayout layout_;
  float* params_;
  float* grads_;
  GradReadyHook grad_ready_;
  ParamResidency* residency_ = nullptr;
  TensorParallel* tp_ = nullptr;  // null when the blocks are whole here
  bool sp_ = false;
  bool split_backward_ = false;
  int64_t head_chunk_rows_ = 0;
  // Token rows held here of a pass's n.
  int64_t rows_here(int64_t n) const { return sp_ ? n / tp_size() : n; }
  // The (N,C) tensor whose rows here are `mine`: mine itself, or under
  // sequence parallelism gathered from the group into the workspace.
  const float* gather_rows(const float* mine, int64_t n) const;
  // The rows here of the sum over the group of `partial` (N,C): summed in
  // place, or under sequence parallelism reduce-scattered to the workspace.
  const float* sum_rows(float* partial, int64_t n) const;
  // Sequence parallelism: sums the workspace's LayerNorm gradients (count
  // floats, C per tensor) over the group and adds them at `offsets`.
  void sum_norm_grads(int64_t count, std::initializer_list<int64_t> offsets);
  // Megatron's two collectives: sums a row-parallel output (forward) or a
  // column-parallel input gradient (backward), (N,C), over the tp group.
  void tp_sum(float* data, int64_t count) const {
    if (tp_ && tp_->size() > 1) tp_->all_reduce_sum(data, count);
  }

  // The parameter ranges the passes acquire as units.
  struct Range {
    int64_t begin, end;
  };
  Range embeddings_range() const;  // wte and wpe
  Range wte_range() const;         // the LM head's matrix
  Range block_range(int64_t layer) const;
  Range ln_f_range() const;
  void acquire(Range r) const {
    if (residency_) residency_->acquire(r.begin, r.end);
  }
  void release(Range r) const {
    if (residency_) residency_->release(r.begin, r.end);
  }
  void prefetch(Range r) const {
    if (residency_) residency_->prefetch(r.begin, r.end);
  }
  // Releases what forward_trunk left acquired (ln_f), for passes without backward.
  void end_forward_only();
  struct WorkspaceDeleter {
    void operator()(Workspace* w) const;
  };
  struct Slot {
    FloatBuffer arena;
    std::unique_ptr<Workspace, WorkspaceDeleter> ws;
    FloatBuffer deferred_arena;      // a split backward's kept gradients
    std::vector<Deferred> deferred;  // one per block of the part
    FloatBuffer head_dlogits;        // (N, V/tp): a deferred dwte's
    bool head_weight_pending = false;
  };
  std::vector<Slot> slots_;  // one micro-batch's activations each
  size_t slot_ = 0;          // the one the passes use now
  Workspace* ws_ = nullptr;  // slots_[slot_]'s, once allocated
};

// GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, residual
// projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2L), zero biases,
// unit LayerNorm weights. Element i of tensor k comes from
// Philox(key(seed, kWeightInit), k, i), i its index in the GLOBAL tensor,
// so the result does not depend on how the buffer is sharded: a tp rank's
// layout gets exactly its part of the whole model's weights.
void init_gpt2_weights(const ParamLayout& layout, int64_t n_layer, uint64_t seed, float* params);

}  // namespace brigade

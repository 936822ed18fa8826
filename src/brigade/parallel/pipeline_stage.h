// Pipeline parallelism: one stage's share of a training step. The model is
// cut into contiguous block ranges (split_stages); stage s holds range s as
// a Gpt part (model/gpt.h part_forward) and runs its instruction list from
// schedule/ (GPipe, 1F1B or ZB-H1, whose backward is split into the input
// half and the deferred weight half), passing the residual stream forward and its
// gradient back over the pipeline group's send/recv. Under the interleaved
// schedule (Megatron's virtual pipeline) the p*v ranges are equal and stage
// s holds v of them as model chunks (model/gpt_chunks.h), chunk c the
// (c*p + s)-th: the stream goes round the stages v times, from the last
// stage's chunk c to the first's chunk c+1.
//
// Transfers overlap compute: a send returns at once and is waited for
// (done once its data has left this stage's buffer) only at the end of
// the step; the receives of the
// next two compute instructions are posted before the current one runs, so
// the data arrives while this stage computes, and the stage waits only when
// an instruction needs it. That wait is the bubble it measures.
//
// With one stage the list is forward then backward for each micro-batch in
// turn, which is exactly the plain gradient-accumulation loop, so the
// trainer runs every layout through this class.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/model/gpt.h"
#include "brigade/model/gpt_chunks.h"
#include "brigade/schedule/schedule.h"

namespace brigade {

class Communicator;
class Work;

// The block ranges of `stages` pipeline stages over model.n_layer blocks:
// `stage_layers` when given (one count per stage, summing to n_layer), else
// contiguous ranges balanced by a cost estimate: a block's GEMM and
// attention FLOPs per token, the LM head's (2 * n_embd * vocab forward, and
// twice that backward) counted on the last stage. Throws Error naming the
// numbers and the fix when stages > n_layer or stage_layers is wrong.
std::vector<LayerRange> split_stages(const GptConfig& model, int stages,
                                     const std::vector<int64_t>& stage_layers = {});

// The model chunks of each of shape.stages stages (index = stage), each
// stage's ascending: one chunk, split_stages's range, unless the schedule
// is interleaved; then shape.virtual_stages chunks of n_layer / (p*v)
// blocks, chunk c of stage s the (c*p + s)-th range (Megatron's). Throws
// Error naming the numbers and the fix when n_layer does not divide into
// p*v ranges or stage_layers is given with the interleaved schedule.
std::vector<std::vector<LayerRange>> stage_chunks(const GptConfig& model,
                                                  const schedule::Shape& shape,
                                                  const std::vector<int64_t>& stage_layers = {});

// Throws Error naming the numbers and the fix when this executor cannot run
// `shape`: fewer micro-batches than stages, virtual stages below 1 or
// without the interleaved schedule, an interleaved micro-batch count that
// is not a multiple of the stages (Megatron's rule).
void check_pipeline_shape(const schedule::Shape& shape);

struct PipelineStepStats {
  double loss_sum = 0;  // the micro-batches' mean losses, summed (last stage only; else 0)
  // Milliseconds this stage waited for a peer's activation or gradient.
  double bubble_ms = 0;
  // Milliseconds it waited at the step's end for its sends to leave: a
  // peer slow to take them, mostly one still computing before the receive
  // (a large message is read from this stage's buffer only once its
  // receive is posted). Idle time as much as bubble_ms is, and counted
  // with it by the trainer; apart here for the trace.
  double send_wait_ms = 0;
  // Most (micro-batch, chunk) passes whose forward had run and whose
  // backward had not: the activations this stage kept at once (GPipe m;
  // 1F1B p - stage; ZB-H1 until the weight half).
  int64_t peak_live = 0;
};

class PipelineStage {
 public:
  // group: the pipeline group, rank = stage (null when shape.stages is 1);
  // it and the model outlive this object. The model is the stage's chunks
  // (shape.virtual_stages of them).
  PipelineStage(Communicator* group, GptChunks& model, const schedule::Shape& shape);
  ~PipelineStage();

  int stage() const { return stage_; }
  int stages() const { return static_cast<int>(shape_.stages); }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == shape_.stages; }

  // The activation slots each chunk's model allocates in a step (the most
  // of its micro-batches alive at once; each slot is a whole workspace).
  std::vector<int64_t> slots_per_chunk() const;

  // Fills the token buffers passed to run() with micro-batch `mb`'s inputs
  // and targets.
  using Fill = std::function<void(int64_t mb)>;
  // One step's forward and backward passes, up to (not including) the
  // optimizer step. `fill` is called before each forward on the first and
  // last stages. Around this stage's last backward (the data-parallel
  // reduction's): `before_last_backward` is called just before it (may be
  // empty), and `last_backward_hook` is the model's grad-ready hook during
  // it (may be empty; offsets of the whole buffer: the last backward is
  // chunk 0's, the lowest, so every offset above it is final by then).
  // Throws CommError when a peer fails or times out.
  PipelineStepStats run(const Fill& fill, const int32_t* inputs, const int32_t* targets, int64_t b,
                        int64_t t, float loss_scale,
                        const std::function<void()>& before_last_backward,
                        const Gpt::GradReadyHook& last_backward_hook);

  // Forward only, one micro-batch through every stage (evaluation): every
  // stage calls it with the same tokens; returns the mean loss on every stage.
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t b, int64_t t);

  // The step's losses (`loss`: run()'s loss_sum, with whatever the caller
  // did to it) summed over the stages, on every stage. It is the step's
  // first collective over the pipeline group after the instruction lists,
  // so it is where a stage that finished its list early waits for a peer
  // still draining (under 1F1B the last stage waits for the first's last
  // backward): returns the milliseconds waited, which are bubble, not
  // communication (the schedule's idle time at the drain; the transfer of
  // one double inside it is microseconds). Collectives after it (the tied
  // wte's sum) then find their peers ready and measure transfer alone.
  // A no-op returning 0 with one stage.
  double sum_losses_at_drain(double* loss);

  // The tied wte: the first and last stages each hold a copy, and each
  // adds the other's gradient to its own (count floats at `grad`), so both
  // copies get the same update. A no-op on other stages and with one stage.
  void sum_tied_gradients(float* grad, int64_t count);

 private:
  // Posts the receives of list_ up to index `until`.
  void post_receives(size_t until, int64_t elements);
  // Chunk c's place in the whole pipeline, 0 to p*v - 1.
  int64_t virtual_stage(int64_t chunk) const { return shape_.virtual_stage(stage_, chunk); }
  bool model_first(int64_t chunk) const { return virtual_stage(chunk) == 0; }
  bool model_last(int64_t chunk) const {
    return virtual_stage(chunk) + 1 == shape_.stages * shape_.virtual_stages;
  }
  // The buffers' index of (micro-batch, chunk).
  size_t pass(const schedule::Instruction& in) const {
    return static_cast<size_t>(in.chunk * shape_.microbatches + in.microbatch);
  }
  // Waits for receive `index` of list_; returns the milliseconds waited.
  double wait_receive(size_t index);

  Communicator* group_;
  GptChunks& model_;
  schedule::Shape shape_;
  int stage_ = 0;
  std::vector<schedule::Instruction> list_;
  // Per (micro-batch, chunk) streams: received activation and gradient, sent ones.
  std::vector<FloatBuffer> act_in_, grad_in_, act_out_, grad_out_;
  std::vector<std::shared_ptr<Work>> receives_;  // by list index
  size_t posted_ = 0;                            // list_[0, posted_) receives are posted
  std::vector<std::shared_ptr<Work>> sends_;
};

}  // namespace brigade

#include "brigade/parallel/pipeline_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>

#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/trace.h"

namespace brigade {

using schedule::Instruction;
using schedule::Op;

std::vector<LayerRange> split_stages(const GptConfig& model, int stages,
                                     const std::vector<int64_t>& stage_layers) {
  const int64_t layers = model.n_layer;
  if (stages < 1) throw_error("parallel.pp must be at least 1, got {}", stages);
  if (stages > layers) {
    throw_error(
        "parallel.pp = {} stages but the model has n_layer = {} blocks: each stage needs at "
        "least one block; set parallel.pp <= {}",
        stages, layers, layers);
  }
  std::vector<LayerRange> ranges;
  if (!stage_layers.empty()) {
    int64_t sum = 0;
    std::string listed;
    for (const int64_t n : stage_layers) {
      sum += n;
      listed += fmt::format("{}{}", listed.empty() ? "" : ", ", n);
    }
    const bool positive =
        std::all_of(stage_layers.begin(), stage_layers.end(), [](int64_t n) { return n > 0; });
    if (static_cast<int64_t>(stage_layers.size()) != stages || sum != layers || !positive) {
      throw_error(
          "parallel.stage_layers = [{}] must give {} positive block counts (one per stage, "
          "parallel.pp = {}) summing to n_layer = {}; they sum to {}",
          listed, stages, stages, layers, sum);
    }
    int64_t begin = 0;
    for (const int64_t n : stage_layers) {
      ranges.push_back({begin, begin + n});
      begin += n;
    }
    return ranges;
  }
  // Forward FLOPs per token (backward is twice both, so the ratio holds):
  // a block's GEMMs (12 C^2 weights, 2 FLOPs each) and attention (scores
  // and values, 2 * 2 * T * C); the LM head's 2 * C * V on the last stage.
  const double c = static_cast<double>(model.n_embd);
  const double block = 24.0 * c * c + 4.0 * static_cast<double>(model.block_size) * c;
  const double head = 2.0 * c * static_cast<double>(model.vocab_size);
  const auto cost = [&](int64_t begin, int64_t end) {
    return static_cast<double>(end - begin) * block + (end == layers ? head : 0.0);
  };
  // best[s][l]: the least maximum stage cost of blocks [0, l) over s stages.
  const double inf = std::numeric_limits<double>::infinity();
  const auto p = static_cast<size_t>(stages), n = static_cast<size_t>(layers);
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(p + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t s = 1; s <= p; ++s) {
    for (size_t l = s; l <= n; ++l) {
      for (size_t k = s - 1; k < l; ++k) {
        const double v =
            std::max(best[s - 1][k], cost(static_cast<int64_t>(k), static_cast<int64_t>(l)));
        if (v < best[s][l]) {
          best[s][l] = v;
          cut[s][l] = static_cast<int64_t>(k);
        }
      }
    }
  }
  ranges.resize(p);
  int64_t end = layers;
  for (size_t s = p; s >= 1; --s) {
    const int64_t begin = cut[s][static_cast<size_t>(end)];
    ranges[s - 1] = {begin, end};
    end = begin;
  }
  return ranges;
}

std::vector<std::vector<LayerRange>> stage_chunks(const GptConfig& model,
                                                  const schedule::Shape& shape,
                                                  const std::vector<int64_t>& stage_layers) {
  const auto p = static_cast<int>(shape.stages);
  std::vector<std::vector<LayerRange>> chunks(static_cast<size_t>(p));
  if (shape.kind != schedule::Kind::kInterleaved) {
    const std::vector<LayerRange> ranges = split_stages(model, p, stage_layers);
    for (size_t s = 0; s < ranges.size(); ++s) chunks[s] = {ranges[s]};
    return chunks;
  }
  const int64_t v = shape.virtual_stages, ranges = shape.stages * v;
  if (!stage_layers.empty()) {
    throw_error(
        "parallel.stage_layers is given, but the interleaved schedule cuts the n_layer = {} "
        "blocks into parallel.pp * parallel.virtual_stages = {} equal chunks itself: remove "
        "parallel.stage_layers, or use schedule \"1f1b\"",
        model.n_layer, ranges);
  }
  if (model.n_layer % ranges != 0) {
    throw_error(
        "the interleaved schedule cuts the blocks into parallel.pp * parallel.virtual_stages = "
        "{} * {} = {} equal chunks, but n_layer = {} is not a multiple of {}: choose "
        "virtual_stages (or pp) so that pp * virtual_stages divides {}",
        shape.stages, v, ranges, model.n_layer, ranges, model.n_layer);
  }
  const int64_t per = model.n_layer / ranges;
  for (int64_t s = 0; s < shape.stages; ++s) {
    for (int64_t c = 0; c < v; ++c) {
      const int64_t begin = shape.virtual_stage(s, c) * per;
      chunks[static_cast<size_t>(s)].push_back({begin, begin + per});
    }
  }
  return chunks;
}

void check_pipeline_shape(const schedule::Shape& shape) {
  if (shape.virtual_stages < 1) {
    throw_error(
        "parallel.virtual_stages = {}: it must be at least 1 (1, the default: one model chunk per "
        "stage; 2 or more with schedule \"interleaved\")",
        shape.virtual_stages);
  }
  if (shape.kind != schedule::Kind::kInterleaved && shape.virtual_stages != 1) {
    throw_error(
        "parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (the {} schedule "
        "runs one model chunk per stage): set the schedule, or virtual_stages = 1",
        shape.virtual_stages, schedule::kind_name(shape.kind));
  }
  if (shape.kind == schedule::Kind::kInterleaved && shape.virtual_stages < 2) {
    throw_error(
        "parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2 model chunks per "
        "stage, got {} (with 1 it is 1f1b: use that)",
        shape.virtual_stages);
  }
  if (shape.kind == schedule::Kind::kInterleaved && shape.stages > 1 &&
      shape.microbatches % shape.stages != 0) {
    const int64_t below = shape.microbatches / shape.stages * shape.stages;
    throw_error(
        "train.grad_accum = {} micro-batches is not a multiple of parallel.pp = {}: the "
        "interleaved schedule sends them round in groups of pp (Megatron's rule); set "
        "train.grad_accum to {}{}",
        shape.microbatches, shape.stages, below > 0 ? fmt::format("{} or ", below) : "",
        below + shape.stages);
  }
  if (shape.kind == schedule::Kind::kInterleaved && shape.stages < 2) {
    throw_error(
        "parallel.schedule = \"interleaved\" needs parallel.pp >= 2 stages, got {}: set "
        "parallel.pp, or leave the schedule at its default without pipeline parallelism",
        shape.stages);
  }
  schedule::check(shape);
  if (shape.stages > 1 && shape.microbatches < shape.stages) {
    throw_error(
        "train.grad_accum = {} micro-batches cannot fill a pipeline of parallel.pp = {} stages: "
        "set train.grad_accum >= {} (the bubble is (p-1)/(m+p-1) of the step, so more is better)",
        shape.microbatches, shape.stages, shape.stages);
  }
}

namespace {
// Tags: micro-batch mb's activation across the pipeline's boundary b
// (between virtual stages b-1 and b) 2*(lap*m + mb), its gradient one
// more, where lap = (b-1)/p counts the rounds of the stages; a link (a pair
// of stages, one way) carries boundaries p apart, so tags never repeat on
// it. With one chunk per stage lap is 0. Evaluation's stream and the tied
// gradient apart from them.
uint32_t stream_tag(int64_t boundary, int64_t mb, const schedule::Shape& shape, bool grad) {
  const int64_t lap = (boundary - 1) / shape.stages;
  return static_cast<uint32_t>(2 * (lap * shape.microbatches + mb) + (grad ? 1 : 0));
}
constexpr uint32_t kTiedTag = 0x40000001u;
uint32_t eval_tag(int64_t boundary) {
  return static_cast<uint32_t>(0x40000002 + boundary);
}

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}
}  // namespace

PipelineStage::PipelineStage(Communicator* group, GptChunks& model, const schedule::Shape& shape)
    : group_(group), model_(model), shape_(shape) {
  check_pipeline_shape(shape);
  if (shape.stages > 1) {
    BRIGADE_CHECK(group != nullptr && group->size() == shape.stages,
                  "a pipeline of {} stages needs its group", shape.stages);
    stage_ = group->rank();
  }
  BRIGADE_CHECK(model.size() == shape.virtual_stages, "stage {} holds {} model chunks, not {}",
                stage_, model.size(), shape.virtual_stages);
  for (int64_t c = 0; c < model.size(); ++c) {
    const ParamLayout& part = model.chunk(c).layout();
    BRIGADE_CHECK(part.has_embeddings() == model_first(c) && part.has_head() == model_last(c),
                  "stage {}'s model chunk {} does not match its place in the pipeline", stage_, c);
  }
  if (shape.kind == schedule::Kind::kZbH1 && model.config().recompute == Recompute::kFull) {
    throw_error(
        "parallel.schedule = \"zb-h1\" defers weight gradients, which needs every block's "
        "activations, but model.recompute = \"full\" keeps one block's: use schedule \"1f1b\" or "
        "recompute \"none\"");
  }
  list_ = schedule::stage_instructions(shape, stage_);
  // A split backward defers the LM head's weight gradient too: into the
  // micro-batch's W, not its forward (where the head's backward runs).
  const bool split = std::any_of(list_.begin(), list_.end(), [](const Instruction& in) {
    return in.op == Op::kBackwardWeight;
  });
  for (int64_t c = 0; c < model.size(); ++c) model.chunk(c).set_split_backward(split);
  const auto passes = static_cast<size_t>(shape.microbatches * shape.virtual_stages);
  act_in_.resize(passes);
  grad_in_.resize(passes);
  act_out_.resize(passes);
  grad_out_.resize(passes);
}

PipelineStage::~PipelineStage() {
  // Transfers still using our buffers must finish before they go: a send
  // copying out of act_out_/grad_out_, and a posted receive, which a
  // backend (the shm mailbox) completes later by copying a neighbour's data
  // to the raw pointer into act_in_/grad_in_. run() may have thrown with
  // both outstanding; the communicator's timeout bounds each wait.
  const auto settle = [](std::vector<std::shared_ptr<Work>>& works) {
    for (auto& w : works) {
      try {
        if (w) w->wait();
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the step already failed
      }
    }
  };
  settle(sends_);
  settle(receives_);
}

std::vector<int64_t> PipelineStage::slots_per_chunk() const {
  const auto chunks = static_cast<size_t>(model_.size());
  std::vector<int64_t> live(chunks, 0), peak(chunks, 0);
  for (const Instruction& in : list_) {
    const auto c = static_cast<size_t>(in.chunk);
    if (in.op == Op::kForward) peak[c] = std::max(peak[c], ++live[c]);
    if (in.op == Op::kBackward || in.op == Op::kBackwardWeight) --live[c];
  }
  return peak;
}

void PipelineStage::post_receives(size_t until, int64_t elements) {
  for (; posted_ < std::min(until, list_.size()); ++posted_) {
    const Instruction& in = list_[posted_];
    if (in.op != Op::kRecvActivation && in.op != Op::kRecvGrad) continue;
    const bool act = in.op == Op::kRecvActivation;
    FloatBuffer& buf = (act ? act_in_ : grad_in_)[pass(in)];
    if (buf.size() != elements) buf = FloatBuffer(elements);
    const int64_t vs = virtual_stage(in.chunk);
    receives_[posted_] = group_->recv(buf.data(), elements, DType::kF32, static_cast<int>(in.peer),
                                      stream_tag(act ? vs : vs + 1, in.microbatch, shape_, !act));
  }
}

double PipelineStage::wait_receive(size_t index) {
  const int64_t start = now_ns();
  receives_[index]->wait();
  receives_[index].reset();
  return static_cast<double>(now_ns() - start) * 1e-6;
}

PipelineStepStats PipelineStage::run(const Fill& fill, const int32_t* inputs,
                                     const int32_t* targets, int64_t b, int64_t t, float loss_scale,
                                     const std::function<void()>& before_last_backward,
                                     const Gpt::GradReadyHook& last_backward_hook) {
  const int64_t elements = b * t * model_.config().n_embd;
  PipelineStepStats stats;
  receives_.assign(list_.size(), nullptr);
  posted_ = 0;
  sends_.clear();
  // The index of the last backward: data-parallel reduction rides on it.
  size_t last_backward = list_.size();
  for (size_t i = 0; i < list_.size(); ++i) {
    if (list_[i].op == Op::kBackward || list_[i].op == Op::kBackwardWeight) last_backward = i;
  }
  // The hook's "everything above is final" holds when the last backward is
  // of the chunk lowest in the buffer.
  BRIGADE_CHECK(
      !last_backward_hook || last_backward == list_.size() || list_[last_backward].chunk == 0,
      "the last backward of stage {} is of chunk {}, not 0", stage_, list_[last_backward].chunk);
  // Activation slots of each chunk: one per micro-batch in flight, reused.
  const auto chunks = static_cast<size_t>(model_.size());
  std::vector<int64_t> slot_of(act_in_.size(), -1);
  std::vector<std::vector<int64_t>> free_slots(chunks);
  std::vector<int64_t> slots(chunks, 0);
  int64_t live = 0;
  // The receives of the next two compute instructions are posted ahead.
  std::vector<size_t> computes;
  for (size_t i = 0; i < list_.size(); ++i) {
    if (is_compute(list_[i].op)) computes.push_back(i);
  }
  size_t next_compute = 0;
  const auto post_ahead = [&] {
    const size_t ahead =
        next_compute + 1 < computes.size() ? computes[next_compute + 1] : list_.size();
    post_receives(ahead, elements);
  };
  const auto release = [&](const Instruction& in) {
    free_slots[static_cast<size_t>(in.chunk)].push_back(slot_of[pass(in)]);
    slot_of[pass(in)] = -1;
    --live;
  };
  post_ahead();
  for (size_t i = 0; i < list_.size(); ++i) {
    const Instruction& in = list_[i];
    const size_t k = in.op == Op::kOptimizerStep ? 0 : pass(in);
    const int64_t c = in.chunk;
    Gpt& part = model_.chunk(c);
    const bool head = model_last(c), embeddings = model_first(c);
    switch (in.op) {
      case Op::kRecvActivation:
      case Op::kRecvGrad: {
        post_receives(i + 1, elements);
        const trace::Scope span("bubble",
                                in.op == Op::kRecvActivation ? "wait activation" : "wait gradient",
                                in.microbatch, c);
        stats.bubble_ms += wait_receive(i);
        break;
      }
      case Op::kSendActivation:
      case Op::kSendGrad: {
        const bool act = in.op == Op::kSendActivation;
        const FloatBuffer& buf = (act ? act_out_ : grad_out_)[k];
        const int64_t vs = virtual_stage(c);
        sends_.push_back(group_->send(buf.data(), elements, DType::kF32, static_cast<int>(in.peer),
                                      stream_tag(act ? vs + 1 : vs, in.microbatch, shape_, !act)));
        break;
      }
      case Op::kForward: {
        ++next_compute;
        post_ahead();
        if (embeddings || head) fill(in.microbatch);
        auto& free = free_slots[static_cast<size_t>(c)];
        if (free.empty()) free.push_back(slots[static_cast<size_t>(c)]++);
        slot_of[k] = free.back();
        free.pop_back();
        stats.peak_live = std::max(stats.peak_live, ++live);
        if (!head && act_out_[k].size() != elements) act_out_[k] = FloatBuffer(elements);
        const trace::Scope span("compute", "forward", in.microbatch, c);
        stats.loss_sum +=
            part.part_forward(slot_of[k], inputs, embeddings ? nullptr : act_in_[k].data(), targets,
                              loss_scale, head ? nullptr : act_out_[k].data(), b, t);
        break;
      }
      case Op::kBackward: {
        ++next_compute;
        post_ahead();
        if (!embeddings && grad_out_[k].size() != elements) grad_out_[k] = FloatBuffer(elements);
        if (i == last_backward && before_last_backward) before_last_backward();
        const bool hooked = i == last_backward && last_backward_hook;
        if (hooked) model_.set_grad_ready_hook(c, last_backward_hook);
        const trace::Scope span("compute", "backward", in.microbatch, c);
        part.part_backward(slot_of[k], head ? nullptr : grad_in_[k].data(),
                           embeddings ? nullptr : grad_out_[k].data());
        if (hooked) model_.set_grad_ready_hook(c, nullptr);
        release(in);
        break;
      }
      case Op::kBackwardInput: {
        ++next_compute;
        post_ahead();
        if (!embeddings && grad_out_[k].size() != elements) grad_out_[k] = FloatBuffer(elements);
        const trace::Scope span("compute", "backward input", in.microbatch, c);
        part.part_backward_input(slot_of[k], head ? nullptr : grad_in_[k].data(),
                                 embeddings ? nullptr : grad_out_[k].data());
        break;
      }
      case Op::kBackwardWeight: {
        ++next_compute;
        post_ahead();
        if (i == last_backward && before_last_backward) before_last_backward();
        const bool hooked = i == last_backward && last_backward_hook;
        if (hooked) model_.set_grad_ready_hook(c, last_backward_hook);
        const trace::Scope span("compute", "backward weight", in.microbatch, c);
        part.part_backward_weight(slot_of[k]);
        if (hooked) model_.set_grad_ready_hook(c, nullptr);
        release(in);
        break;
      }
      case Op::kOptimizerStep:
        break;  // the trainer's, after the gradients are reduced
    }
  }
  if (!sends_.empty()) {
    const trace::Scope span("bubble", "wait sends");
    const int64_t sends_start = now_ns();
    for (auto& w : sends_) w->wait();
    stats.send_wait_ms = static_cast<double>(now_ns() - sends_start) * 1e-6;
  }
  sends_.clear();
  return stats;
}

double PipelineStage::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t b,
                                   int64_t t) {
  if (stages() == 1) {
    return model_.chunk(0).forward_loss(inputs, targets, b, t);
  }
  // The stream goes round the stages once per chunk, virtual stage by
  // virtual stage; the last computes the loss.
  const int64_t elements = b * t * model_.config().n_embd;
  FloatBuffer in(elements), out(elements);
  double loss = 0;
  for (int64_t c = 0; c < model_.size(); ++c) {
    const int64_t vs = virtual_stage(c);
    const int prev = (stage_ + stages() - 1) % stages(), next = (stage_ + 1) % stages();
    if (!model_first(c)) group_->recv(in.data(), elements, DType::kF32, prev, eval_tag(vs))->wait();
    // A zero loss scale: the head computes the loss only (no gradient).
    loss += model_.chunk(c).part_forward(0, inputs, model_first(c) ? nullptr : in.data(), targets,
                                         0.0f, model_last(c) ? nullptr : out.data(), b, t);
    if (!model_last(c)) {
      group_->send(out.data(), elements, DType::kF32, next, eval_tag(vs + 1))->wait();
    }
  }
  group_->all_reduce(&loss, 1, DType::kF64, ReduceOp::kSum)->wait();
  return loss;
}

double PipelineStage::sum_losses_at_drain(double* loss) {
  if (stages() == 1) return 0.0;
  const trace::Scope span("bubble", "wait drain");
  const int64_t start = now_ns();
  group_->all_reduce(loss, 1, DType::kF64, ReduceOp::kSum)->wait();
  return static_cast<double>(now_ns() - start) * 1e-6;
}

void PipelineStage::sum_tied_gradients(float* grad, int64_t count) {
  if (stages() == 1 || !(first() || last())) return;
  const int partner = first() ? stages() - 1 : 0;
  FloatBuffer theirs(count);
  auto sent = group_->send(grad, count, DType::kF32, partner, kTiedTag);
  group_->recv(theirs.data(), count, DType::kF32, partner, kTiedTag)->wait();
  sent->wait();
  // a + b on one side, b + a on the other: the same float, bit for bit.
  for (int64_t i = 0; i < count; ++i) grad[i] += theirs.data()[i];
}

}  // namespace brigade

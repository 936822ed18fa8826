#include "brigade/parallel/pipeline_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>

#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"

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

void check_pipeline_shape(const schedule::Shape& shape) {
  if (shape.kind == schedule::Kind::kInterleaved) {
    throw_error(
        "parallel.schedule = \"{}\" is planned (brigade plan simulates it) but not executed "
        "yet: use \"gpipe\", \"1f1b\" or \"zb-h1\"",
        schedule::kind_name(shape.kind));
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
// Tags: micro-batch mb's activation 2*mb, its gradient 2*mb+1; evaluation's
// stream and the tied gradient apart from them.
uint32_t activation_tag(int64_t mb) {
  return static_cast<uint32_t>(2 * mb);
}
uint32_t grad_tag(int64_t mb) {
  return static_cast<uint32_t>(2 * mb + 1);
}
constexpr uint32_t kEvalTag = 0x40000000u;
constexpr uint32_t kTiedTag = 0x40000001u;

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}
}  // namespace

PipelineStage::PipelineStage(Communicator* group, Gpt& model, const schedule::Shape& shape)
    : group_(group), model_(model), shape_(shape) {
  check_pipeline_shape(shape);
  if (shape.stages > 1) {
    BRIGADE_CHECK(group != nullptr && group->size() == shape.stages,
                  "a pipeline of {} stages needs its group", shape.stages);
    stage_ = group->rank();
  }
  BRIGADE_CHECK(model.layout().has_embeddings() == first() && model.layout().has_head() == last(),
                "stage {}'s model part does not match its place in the pipeline", stage_);
  if (shape.kind == schedule::Kind::kZbH1 && model.config().recompute == Recompute::kFull) {
    throw_error(
        "parallel.schedule = \"zb-h1\" defers weight gradients, which needs every block's "
        "activations, but model.recompute = \"full\" keeps one block's: use schedule \"1f1b\" or "
        "recompute \"none\"");
  }
  list_ = schedule::stage_instructions(shape, stage_);
  const auto m = static_cast<size_t>(shape.microbatches);
  act_in_.resize(m);
  grad_in_.resize(m);
  act_out_.resize(m);
  grad_out_.resize(m);
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

void PipelineStage::post_receives(size_t until, int64_t elements) {
  for (; posted_ < std::min(until, list_.size()); ++posted_) {
    const Instruction& in = list_[posted_];
    if (in.op != Op::kRecvActivation && in.op != Op::kRecvGrad) continue;
    const bool act = in.op == Op::kRecvActivation;
    FloatBuffer& buf = (act ? act_in_ : grad_in_)[static_cast<size_t>(in.microbatch)];
    if (buf.size() != elements) buf = FloatBuffer(elements);
    receives_[posted_] =
        group_->recv(buf.data(), elements, DType::kF32, static_cast<int>(in.peer),
                     act ? activation_tag(in.microbatch) : grad_tag(in.microbatch));
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
  // Activation slots of the model: one per micro-batch in flight, reused.
  std::vector<int64_t> slot_of(static_cast<size_t>(shape_.microbatches), -1);
  std::vector<int64_t> free_slots;
  int64_t slots = 0;
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
  post_ahead();
  for (size_t i = 0; i < list_.size(); ++i) {
    const Instruction& in = list_[i];
    const auto mb = static_cast<size_t>(in.microbatch);
    switch (in.op) {
      case Op::kRecvActivation:
      case Op::kRecvGrad:
        post_receives(i + 1, elements);
        stats.bubble_ms += wait_receive(i);
        break;
      case Op::kSendActivation:
      case Op::kSendGrad: {
        const bool act = in.op == Op::kSendActivation;
        const FloatBuffer& buf = (act ? act_out_ : grad_out_)[mb];
        sends_.push_back(
            group_->send(buf.data(), elements, DType::kF32, static_cast<int>(in.peer),
                         act ? activation_tag(in.microbatch) : grad_tag(in.microbatch)));
        break;
      }
      case Op::kForward: {
        ++next_compute;
        post_ahead();
        if (first() || last()) fill(in.microbatch);
        if (free_slots.empty()) free_slots.push_back(slots++);
        slot_of[mb] = free_slots.back();
        free_slots.pop_back();
        stats.peak_live =
            std::max(stats.peak_live, slots - static_cast<int64_t>(free_slots.size()));
        if (!last() && act_out_[mb].size() != elements) act_out_[mb] = FloatBuffer(elements);
        stats.loss_sum +=
            model_.part_forward(slot_of[mb], inputs, first() ? nullptr : act_in_[mb].data(),
                                targets, loss_scale, last() ? nullptr : act_out_[mb].data(), b, t);
        break;
      }
      case Op::kBackward: {
        ++next_compute;
        post_ahead();
        if (!first() && grad_out_[mb].size() != elements) grad_out_[mb] = FloatBuffer(elements);
        if (i == last_backward && before_last_backward) before_last_backward();
        const bool hooked = i == last_backward && last_backward_hook;
        if (hooked) model_.set_grad_ready_hook(last_backward_hook);
        model_.part_backward(slot_of[mb], last() ? nullptr : grad_in_[mb].data(),
                             first() ? nullptr : grad_out_[mb].data());
        if (hooked) model_.set_grad_ready_hook(nullptr);
        free_slots.push_back(slot_of[mb]);
        slot_of[mb] = -1;
        break;
      }
      case Op::kBackwardInput:
        ++next_compute;
        post_ahead();
        if (!first() && grad_out_[mb].size() != elements) grad_out_[mb] = FloatBuffer(elements);
        model_.part_backward_input(slot_of[mb], last() ? nullptr : grad_in_[mb].data(),
                                   first() ? nullptr : grad_out_[mb].data());
        break;
      case Op::kBackwardWeight: {
        ++next_compute;
        post_ahead();
        if (i == last_backward && before_last_backward) before_last_backward();
        const bool hooked = i == last_backward && last_backward_hook;
        if (hooked) model_.set_grad_ready_hook(last_backward_hook);
        model_.part_backward_weight(slot_of[mb]);
        if (hooked) model_.set_grad_ready_hook(nullptr);
        free_slots.push_back(slot_of[mb]);
        slot_of[mb] = -1;
        break;
      }
      case Op::kOptimizerStep:
        break;  // the trainer's, after the gradients are reduced
    }
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  return stats;
}

double PipelineStage::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t b,
                                   int64_t t) {
  if (stages() == 1) {
    return model_.forward_loss(inputs, targets, b, t);
  }
  const int64_t elements = b * t * model_.config().n_embd;
  FloatBuffer in(first() ? 0 : elements), out(last() ? 0 : elements);
  if (!first()) group_->recv(in.data(), elements, DType::kF32, stage_ - 1, kEvalTag)->wait();
  // A zero loss scale: the head's gradient is zero, so nothing accumulates.
  double loss = model_.part_forward(0, inputs, in.data(), targets, 0.0f, out.data(), b, t);
  if (!last()) group_->send(out.data(), elements, DType::kF32, stage_ + 1, kEvalTag)->wait();
  group_->all_reduce(&loss, 1, DType::kF64, ReduceOp::kSum)->wait();
  return loss;
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

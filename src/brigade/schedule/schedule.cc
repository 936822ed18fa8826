#include "brigade/schedule/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade::schedule {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kGpipe:
      return "gpipe";
    case Kind::kOneFOneB:
      return "1f1b";
    case Kind::kInterleaved:
      return "interleaved";
    case Kind::kZbH1:
      return "zb-h1";
  }
  return "?";
}

Kind parse_kind(const std::string& name) {
  for (Kind k : {Kind::kGpipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZbH1}) {
    if (name == kind_name(k)) return k;
  }
  throw_error("unknown pipeline schedule \"{}\" (known: gpipe, 1f1b, interleaved, zb-h1)", name);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kBackwardInput:
      return "B-input";
    case Op::kBackwardWeight:
      return "B-weight";
    case Op::kSendActivation:
      return "send-activation";
    case Op::kRecvActivation:
      return "recv-activation";
    case Op::kSendGrad:
      return "send-grad";
    case Op::kRecvGrad:
      return "recv-grad";
    case Op::kOptimizerStep:
      return "optimizer-step";
  }
  return "?";
}

std::string to_string(const Instruction& in) {
  if (in.op == Op::kOptimizerStep) return op_name(in.op);
  std::string text = fmt::format("{} mb={} chunk={}", op_name(in.op), in.microbatch, in.chunk);
  if (in.op == Op::kSendActivation || in.op == Op::kSendGrad) {
    text += fmt::format(" -> stage {}", in.peer);
  } else if (in.op == Op::kRecvActivation || in.op == Op::kRecvGrad) {
    text += fmt::format(" <- stage {}", in.peer);
  }
  return text;
}

void check(const Shape& s) {
  const char* name = kind_name(s.kind);
  if (s.stages < 1) throw_error("pipeline stages must be at least 1, got {}", s.stages);
  if (s.microbatches < 1) {
    throw_error("the {} schedule needs at least 1 micro-batch, got {} (raise train.grad_accum)",
                name, s.microbatches);
  }
  if (s.virtual_stages < 1) {
    throw_error("virtual stages must be at least 1, got {}", s.virtual_stages);
  }
  if (s.kind != Kind::kInterleaved && s.virtual_stages != 1) {
    throw_error(
        "the {} schedule runs one model chunk per stage, but virtual stages = {} (set virtual "
        "stages to 1, or use the interleaved schedule)",
        name, s.virtual_stages);
  }
  if (s.kind == Kind::kInterleaved) {
    if (s.virtual_stages < 2) {
      throw_error(
          "the interleaved schedule needs at least 2 virtual stages per stage, got {} (with 1 it "
          "is 1f1b: use that)",
          s.virtual_stages);
    }
    if (s.stages < 2) {
      throw_error("the interleaved schedule needs at least 2 pipeline stages, got {}", s.stages);
    }
    if (s.microbatches % s.stages != 0) {
      throw_error(
          "the interleaved schedule sends micro-batches round in groups of the {} stages, but {} "
          "micro-batches is not a multiple of {} (use {} or {} micro-batches)",
          s.stages, s.microbatches, s.stages, s.microbatches / s.stages * s.stages,
          (s.microbatches / s.stages + 1) * s.stages);
    }
  }
}

namespace {

// Wraps one compute step in the receive before it and the send after it.
class ListBuilder {
 public:
  ListBuilder(const Shape& shape, int64_t stage, std::vector<Instruction>& out)
      : shape_(shape), stage_(stage), list_(out) {
    list_.clear();
    // Per chunk pass: a compute instruction and at most one receive and one
    // send, forward and backward, and one weight pass.
    list_.reserve(static_cast<size_t>(7 * shape.microbatches * shape.virtual_stages + 1));
  }

  void forward(int64_t mb, int64_t chunk) {
    const int64_t vs = shape_.virtual_stage(stage_, chunk);
    if (vs > 0) push(Op::kRecvActivation, mb, chunk, (vs - 1) % shape_.stages);
    push(Op::kForward, mb, chunk, -1);
    if (vs < last_virtual()) push(Op::kSendActivation, mb, chunk, (vs + 1) % shape_.stages);
  }
  // `op` is kBackward or kBackwardInput: the part the previous stage waits for.
  void backward(Op op, int64_t mb, int64_t chunk) {
    const int64_t vs = shape_.virtual_stage(stage_, chunk);
    if (vs < last_virtual()) push(Op::kRecvGrad, mb, chunk, (vs + 1) % shape_.stages);
    push(op, mb, chunk, -1);
    if (vs > 0) push(Op::kSendGrad, mb, chunk, (vs - 1) % shape_.stages);
  }
  void weight(int64_t mb, int64_t chunk) { push(Op::kBackwardWeight, mb, chunk, -1); }

  void finish() { push(Op::kOptimizerStep, -1, 0, -1); }

 private:
  int64_t last_virtual() const { return shape_.stages * shape_.virtual_stages - 1; }
  void push(Op op, int64_t mb, int64_t chunk, int64_t peer) {
    list_.push_back(Instruction{op, mb, chunk, peer});
  }

  const Shape& shape_;
  int64_t stage_;
  std::vector<Instruction>& list_;
};

// GPipe: fill with every forward, drain with every backward.
void gpipe(const Shape& s, ListBuilder& b) {
  for (int64_t mb = 0; mb < s.microbatches; ++mb) b.forward(mb, 0);
  for (int64_t mb = 0; mb < s.microbatches; ++mb) b.backward(Op::kBackward, mb, 0);
}

// 1F1B: stage s runs p-s-1 forwards ahead, then alternates one forward with
// one backward, then drains; micro-batch i's backward frees its activations,
// so at most p-s are alive.
void one_f_one_b(const Shape& s, int64_t stage, ListBuilder& b) {
  const int64_t m = s.microbatches;
  const int64_t warmup = std::min(s.stages - stage - 1, m);
  for (int64_t i = 0; i < warmup; ++i) b.forward(i, 0);
  for (int64_t i = 0; i < m - warmup; ++i) {
    b.forward(warmup + i, 0);
    b.backward(Op::kBackward, i, 0);
  }
  for (int64_t i = m - warmup; i < m; ++i) b.backward(Op::kBackward, i, 0);
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3.1):
// 1F1B's order with each backward cut into its input part (which the
// previous stage waits for) and its weight part. Stage s runs the weight part
// of micro-batch i after the input part of micro-batch i+s: the s deferred
// weight passes fill the drain, where 1F1B's stage s idles for s backwards,
// and the previous stages get their gradients a weight pass sooner. A
// micro-batch's activations live until its weight part, so stage s keeps at
// most (p-s-1) + 1 + s = p alive: 1F1B's peak on stage 0.
void zb_h1(const Shape& s, int64_t stage, ListBuilder& b) {
  const int64_t m = s.microbatches;
  const int64_t warmup = std::min(s.stages - stage - 1, m);
  int64_t next_weight = 0;
  auto backward = [&](int64_t i) {
    b.backward(Op::kBackwardInput, i, 0);
    if (i - stage >= 0) b.weight(next_weight++, 0);
  };
  for (int64_t i = 0; i < warmup; ++i) b.forward(i, 0);
  for (int64_t i = 0; i < m - warmup; ++i) {
    b.forward(warmup + i, 0);
    backward(i);
  }
  for (int64_t i = m - warmup; i < m; ++i) backward(i);
  while (next_weight < m) b.weight(next_weight++, 0);
}

// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, section 2.2;
// megatron/core/pipeline_parallel/schedules.py): the stage's m*v chunk
// passes go in groups of p micro-batches, chunk 0 first for forwards and
// chunk v-1 first for backwards; the warm-up runs (p-s-1)*2 + (v-1)*p
// forwards so the first backward finds its gradient waiting.
void interleaved(const Shape& s, int64_t stage, ListBuilder& b) {
  const int64_t p = s.stages, v = s.virtual_stages, total = s.microbatches * v;
  auto chunk_of = [&](int64_t k, bool forward) {
    const int64_t c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mb_of = [&](int64_t k) { return k / (p * v) * p + k % p; };
  const int64_t warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  for (int64_t k = 0; k < warmup; ++k) b.forward(mb_of(k), chunk_of(k, true));
  for (int64_t i = 0; i < total - warmup; ++i) {
    b.forward(mb_of(warmup + i), chunk_of(warmup + i, true));
    b.backward(Op::kBackward, mb_of(i), chunk_of(i, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) {
    b.backward(Op::kBackward, mb_of(k), chunk_of(k, false));
  }
}

}  // namespace

std::vector<Instruction> stage_instructions(const Shape& shape, int64_t stage) {
  std::vector<Instruction> list;
  stage_instructions(shape, stage, list);
  return list;
}

void stage_instructions(const Shape& shape, int64_t stage, std::vector<Instruction>& out) {
  check(shape);
  if (stage < 0 || stage >= shape.stages) {
    throw_error("stage {} is outside the pipeline's {} stages (0 to {})", stage, shape.stages,
                shape.stages - 1);
  }
  ListBuilder b(shape, stage, out);
  switch (shape.kind) {
    case Kind::kGpipe:
      gpipe(shape, b);
      break;
    case Kind::kOneFOneB:
      one_f_one_b(shape, stage, b);
      break;
    case Kind::kInterleaved:
      interleaved(shape, stage, b);
      break;
    case Kind::kZbH1:
      zb_h1(shape, stage, b);
      break;
  }
  b.finish();
}

std::vector<std::vector<Instruction>> all_stage_instructions(const Shape& shape) {
  std::vector<std::vector<Instruction>> lists;
  all_stage_instructions(shape, lists);
  return lists;
}

void all_stage_instructions(const Shape& shape, std::vector<std::vector<Instruction>>& out) {
  check(shape);
  out.resize(static_cast<size_t>(shape.stages));
  for (int64_t s = 0; s < shape.stages; ++s) {
    stage_instructions(shape, s, out[static_cast<size_t>(s)]);
  }
}

}  // namespace brigade::schedule

// Pipeline schedules as data (ARCHITECTURE.md, decision 4): a pure function
// from (kind, stages, micro-batches, virtual stages, stage) to the list of
// instructions that stage runs, in order. The executor in parallel/ runs one
// list against the model; the planner in sim/ and the tests run all lists
// together in simulate() (simulate.h) without processes.
//
// Conventions every list follows, so an executor and the simulator agree:
// - Stage s holds model chunks 0..v-1; chunk c is virtual stage c*p + s
//   (Megatron's interleaving), so activations go s -> s+1 and, from the last
//   stage, back to stage 0's next chunk.
// - A forward of a chunk that is not the model's first is preceded by its
//   kRecvActivation; one that is not the model's last is followed by its
//   kSendActivation. Backward (or backward-input) mirrors this with
//   kRecvGrad before and kSendGrad after. Backward-weight moves nothing.
// - Sends are asynchronous (the stage goes on at once); receives block until
//   the data is there. Every list ends with one kOptimizerStep.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brigade::schedule {

enum class Kind {
  kGpipe,        // all forwards, then all backwards: m micro-batches alive
  kOneFOneB,     // PipeDream-flush / Megatron: at most p alive on stage 0
  kInterleaved,  // Megatron's interleaved 1F1B over v chunks per stage
  kZbH1,         // Qi et al. 2024: backward split, weight gradients deferred
};
const char* kind_name(Kind kind);  // "gpipe", "1f1b", "interleaved", "zb-h1"
// Parses kind_name's form; throws Error naming the known kinds.
Kind parse_kind(const std::string& name);

enum class Op {
  kForward,
  kBackward,        // input and weight gradients together (GPipe, 1F1B, interleaved)
  kBackwardInput,   // the gradient the previous stage waits for (ZB-H1)
  kBackwardWeight,  // the weight gradient, free to run later (ZB-H1)
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kOptimizerStep,
};
const char* op_name(Op op);

struct Instruction {
  Op op = Op::kForward;
  int64_t microbatch = -1;  // -1 for the optimizer step
  int64_t chunk = 0;        // this stage's model chunk the instruction belongs to
  int64_t peer = -1;        // send/recv: the other stage; -1 otherwise
  bool operator==(const Instruction&) const = default;
};
// "F mb=3 chunk=1", "send-activation mb=3 chunk=1 -> stage 2", ...
std::string to_string(const Instruction& instruction);

struct Shape {
  Kind kind = Kind::kOneFOneB;
  int64_t stages = 1;          // p
  int64_t microbatches = 1;    // m
  int64_t virtual_stages = 1;  // v: chunks per stage (interleaved only)
  int64_t virtual_stage(int64_t stage, int64_t chunk) const { return chunk * stages + stage; }
};

// Throws Error naming the numbers and the fix when `shape` cannot run:
// p, m, v < 1; v != 1 for a schedule without chunks; interleaved with v < 2,
// p < 2 or m not a multiple of p (Megatron's requirement: its micro-batches
// go round in groups of p).
void check(const Shape& shape);

// The instructions stage `stage` runs for one training step. Throws as
// check() does, and for a stage outside [0, p).
std::vector<Instruction> stage_instructions(const Shape& shape, int64_t stage);
// All stages' lists, index = stage.
std::vector<std::vector<Instruction>> all_stage_instructions(const Shape& shape);
// The same into `out`, reusing its memory (the planner simulates thousands
// of schedules; fresh lists cost more in page faults than in building).
void stage_instructions(const Shape& shape, int64_t stage, std::vector<Instruction>& out);
void all_stage_instructions(const Shape& shape, std::vector<std::vector<Instruction>>& out);

}  // namespace brigade::schedule

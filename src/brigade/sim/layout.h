// One way to cut a training job across GPUs, and the job it cuts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/model/gpt_config.h"
#include "brigade/schedule/schedule.h"

namespace brigade::sim {

// What the backward pass recomputes. Selective recomputes only the core
// attention (QK^T, softmax, dropout, attention over V), whose activations
// grow with s^2 but whose FLOPs are few (Korthikanti et al. 2022).
enum class PlanRecompute { kNone, kSelective, kFull };
const char* plan_recompute_name(PlanRecompute r);

// Ranks are laid out tp fastest, then dp, then pp (Megatron-LM's order): a
// tensor-parallel group sits inside one node, pipeline neighbours are
// tp * dp ranks apart.
struct Layout {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  int64_t vp = 1;  // virtual stages (model chunks) per pipeline rank
  int zero = 0;    // 0: none, 1: optimizer state, 2: + gradients, 3: + parameters
  PlanRecompute recompute = PlanRecompute::kNone;
  bool sp = false;    // sequence parallelism (needs tp > 1)
  int64_t micro = 1;  // micro-batch size, sequences
  // The pipeline schedule. 1F1B with vp > 1 means interleaved 1F1B, as
  // Megatron-LM names it (see pipeline_schedule()).
  schedule::Kind schedule = schedule::Kind::kOneFOneB;

  int64_t gpus() const { return tp * pp * dp; }
  // The schedule the pipeline runs: `schedule`, except that 1F1B over
  // virtual stages is the interleaved schedule.
  schedule::Kind pipeline_schedule() const;
  // "tp=8,pp=8,dp=6,vp=1,zero=1,recompute=full,sp=false,micro=1,schedule=1f1b"
  std::string to_string() const;
  // Parses that form; keys may come in any order and missing keys keep their
  // defaults (the schedule's: interleaved when vp > 1, else 1f1b). Throws
  // Error naming the bad key or value.
  static Layout parse(const std::string& text);
};

// What the software being modelled does. The defaults describe a current
// system (Brigade's own design on GPUs); the published runs of 2021-2022 used
// `megatron_2021()`.
struct SystemFeatures {
  bool flash_attention = true;  // fused attention: no s^2 activations
  bool attention_dropout = false;
  bool overlap_dp = true;       // gradient buckets reduced during backward
  double act_bytes = 2;         // bf16 activations
  double param_bytes = 2;       // bf16 weights used by the kernels
  double grad_bytes = 2;        // gradients as reduced across dp
  double optimizer_bytes = 12;  // fp32 master weights + Adam's two moments
  // Bytes moved per parameter around the optimizer step: unscale and
  // overflow check (read grad), gradient norm (read grad), Adam (read grad,
  // master, m, v; write master, m, v), bf16 copy (read master, write weights),
  // zeroing the gradient buffer.
  double optimizer_traffic_bytes = 48;
  double dp_bucket_bytes = 40e6 * 2;  // gradient bucket (Megatron's 40M elements)
  // Brigade's LM head runs its backward inside the forward pass (one
  // chunked kernel with the loss, the logits never all kept), so the last
  // stage's forward carries it and only ln_f's backward is left to B;
  // under ZB-H1 the head's weight gradient waits for W instead, its
  // dlogits kept per micro-batch until then. Megatron computes all of it
  // in its backward.
  bool head_backward_in_forward = true;
  // The pipeline schedules the software can run; the search picks among them.
  std::vector<schedule::Kind> schedules = {schedule::Kind::kGpipe, schedule::Kind::kOneFOneB,
                                           schedule::Kind::kInterleaved, schedule::Kind::kZbH1};

  static SystemFeatures megatron_2021();
};

// The job: model shape, sequence length and global batch (sequences).
struct Workload {
  GptConfig model;  // block_size is ignored; seq_len is what runs
  int64_t seq_len = 2048;
  int64_t global_batch = 512;
  SystemFeatures features;
};

}  // namespace brigade::sim

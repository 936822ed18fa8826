#include "brigade/cli/training_layout.h"

#include "brigade/core/error.h"
#include "brigade/model/gpt_config.h"
#include "brigade/train/train_options.h"

namespace brigade::cli {

TrainingLayout training_layout(const Config& config, int64_t processes) {
  Config copy = config;  // the reads below mark keys used; the caller's stay as they were
  const GptConfig model = GptConfig::from_config(copy);
  const TrainOptions options = TrainOptions::from_config(copy);
  const int64_t tp = options.parallel.tp, pp = options.parallel.pp;
  if (processes < 1 || processes % (tp * pp) != 0) {
    throw_error(
        "{} workers are not a multiple of parallel.tp = {} times parallel.pp = {}: a dp x tp x pp "
        "mesh needs dp * tp * pp of them; plan for a multiple of {}",
        processes, tp, pp, tp * pp);
  }
  const int64_t dp = processes / (tp * pp);
  if (copy.has("parallel.dp") && options.parallel.dp != dp) {
    throw_error(
        "the config sets parallel.dp = {} but {} workers at tp {} x pp {} are dp {}: drop "
        "parallel.dp (the number of workers sets it), or plan for {} workers",
        options.parallel.dp, processes, tp, pp, dp, options.parallel.dp * tp * pp);
  }
  model.validate_tensor_parallel(static_cast<int>(tp));
  if (options.parallel.sequence_parallel) model.validate_sequence_parallel(static_cast<int>(tp));

  TrainingLayout out;
  sim::Layout& l = out.layout;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.zero = options.parallel.zero;
  l.sp = options.parallel.sequence_parallel;
  l.micro = options.micro_batch;
  l.schedule = schedule::parse_kind(options.parallel.schedule);
  switch (model.recompute) {
    case Recompute::kNone:
      l.recompute = sim::PlanRecompute::kNone;
      break;
    case Recompute::kSelective:
      // The planner's selective is Megatron's (drop the attention scores),
      // which fused attention makes a no-op; Brigade's drops the attention
      // output too and reruns attention forward, a cost it has no term for.
      throw_error(
          "model.recompute = \"selective\": the planner does not model Brigade's selective "
          "recompute yet (it reruns each block's attention forward in backward); plan the run "
          "with model.recompute = \"none\" or \"full\"");
    case Recompute::kFull:
      l.recompute = sim::PlanRecompute::kFull;
      break;
  }
  out.global_batch = options.micro_batch * options.grad_accum * dp;
  return out;
}

}  // namespace brigade::cli

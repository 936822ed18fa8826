#include "brigade/cli/training_layout.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/diag/metrics_server.h"
#include "brigade/elastic/agent.h"
#include "brigade/model/gpt_config.h"
#include "brigade/parallel/pipeline_stage.h"
#include "brigade/train/train_options.h"

namespace brigade::cli {
namespace {

// The planner costs every stage as n_layer / pp blocks; the trainer cuts
// where split_stages says (stage_layers, else balanced with the LM head on
// the last stage), which may differ. A plan of other stages than the run's
// would be a plan of another job, so it is refused.
void check_equal_stages(const GptConfig& model, int pp, const std::vector<int64_t>& stage_layers) {
  const std::vector<LayerRange> ranges = split_stages(model, pp, stage_layers);
  bool equal = true;
  std::string listed, sizes;
  for (const LayerRange& r : ranges) {
    equal = equal && r.end - r.begin == model.n_layer / pp;
    listed += fmt::format("{}[{}, {})", listed.empty() ? "" : ", ", r.begin, r.end);
  }
  if (equal) return;
  if (model.n_layer % pp != 0) {
    throw_error(
        "the trainer cuts n_layer = {} blocks into parallel.pp = {} stages as {}, but the "
        "planner costs equal stages only: plan a parallel.pp that divides {}",
        model.n_layer, pp, listed, model.n_layer);
  }
  for (int s = 0; s < pp; ++s) sizes += fmt::format("{}{}", s == 0 ? "" : ", ", model.n_layer / pp);
  throw_error(
      "the trainer cuts n_layer = {} blocks into parallel.pp = {} stages as {} (balanced with "
      "the LM head on the last stage), but the planner costs equal stages only: set "
      "parallel.stage_layers = [{}] to train and plan equal stages",
      model.n_layer, pp, listed, sizes);
}

}  // namespace

TrainingLayout training_layout(const Config& config, int64_t processes) {
  Config copy = config;  // the reads below mark keys used; the caller's stay as they were
  const GptConfig model = GptConfig::from_config(copy);
  const TrainOptions options = TrainOptions::from_config(copy);
  // What else `brigade train` reads, so that a key nobody reads (a typo) is
  // refused here as it is there.
  elastic::ElasticConfig::from_config(copy);
  if (const std::string metrics = copy.get_string("diag.metrics", "127.0.0.1:0");
      metrics != "off") {
    diag::parse_metrics_address(metrics);
  }
  copy.check_all_used();
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
  check_equal_stages(model, static_cast<int>(pp), options.parallel.stage_layers);

  TrainingLayout out;
  sim::Layout& l = out.layout;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.zero = options.parallel.zero;
  // The model splits the sequence only across a tensor-parallel group.
  l.sp = options.parallel.sequence_parallel && tp > 1;
  l.micro = options.micro_batch;
  l.schedule = schedule::parse_kind(options.parallel.schedule);
  l.vp = options.parallel.virtual_stages;
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
  out.threads = options.threads;
  return out;
}

}  // namespace brigade::cli

#include "brigade/train/train_options.h"

#include <cmath>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/parallel/mesh.h"
#include "brigade/parallel/pipeline_stage.h"

namespace brigade {

TrainOptions TrainOptions::from_config(Config& config) {
  TrainOptions o;
  o.micro_batch = config.get_int("train.micro_batch", o.micro_batch);
  o.grad_accum = config.get_int("train.grad_accum", o.grad_accum);
  o.steps = config.get_int("train.steps", o.steps);
  o.seed = static_cast<uint64_t>(config.get_int("train.seed", static_cast<int64_t>(o.seed)));
  o.threads = config.get_int("train.threads", o.threads);
  o.run_dir = config.get_string("train.run_dir", o.run_dir);
  o.resume = config.get_string("train.resume", o.resume);
  o.eval_every = config.get_int("train.eval_every", o.eval_every);
  o.eval_windows = config.get_int("train.eval_windows", o.eval_windows);
  o.checkpoint_every = config.get_int("train.checkpoint_every", o.checkpoint_every);
  o.keep_checkpoints = config.get_int("train.keep_checkpoints", o.keep_checkpoints);
  o.snapshot_every = config.get_int("train.snapshot_every", o.snapshot_every);
  o.sdc_every = config.get_int("diag.sdc_every", o.sdc_every);
  o.trace = config.get_string("diag.trace", "");

  o.lr.lr = config.get_double("optim.lr", 1e-3);
  o.lr.min_lr = config.get_double("optim.min_lr", o.lr.lr * 0.1);
  o.lr.warmup_steps = config.get_int("optim.warmup_steps", 0);
  o.lr.total_steps = o.steps;
  o.adamw.weight_decay = config.get_double("optim.weight_decay", o.adamw.weight_decay);
  o.adamw.beta1 = config.get_double("optim.beta1", o.adamw.beta1);
  o.adamw.beta2 = config.get_double("optim.beta2", o.adamw.beta2);
  o.adamw.eps = config.get_double("optim.eps", o.adamw.eps);
  o.grad_clip = config.get_double("optim.grad_clip", o.grad_clip);
  o.decay_position_embedding =
      config.get_bool("optim.decay_position_embedding", o.decay_position_embedding);

  o.data.source = config.get_string("data.source", o.data.source);
  o.data.tokenizer = config.get_string("data.tokenizer", o.data.tokenizer);
  o.data.dir = config.get_string("data.dir", o.data.dir);
  o.data.val_fraction = config.get_double("data.val_fraction", o.data.val_fraction);
  o.data.synthetic = config.get_bool("data.synthetic", o.data.synthetic);

  const MeshShape mesh = MeshShape::from_config(config);
  o.parallel.dp = mesh.dp;
  o.parallel.tp = mesh.tp;
  o.parallel.sequence_parallel =
      config.get_bool("parallel.sequence_parallel", o.parallel.sequence_parallel);
  o.parallel.pp = mesh.pp;
  o.parallel.schedule = config.get_string("parallel.schedule", o.parallel.schedule);
  o.parallel.virtual_stages = config.get_int("parallel.virtual_stages", o.parallel.virtual_stages);
  o.parallel.stage_layers = config.get_int_list("parallel.stage_layers");
  o.parallel.zero = static_cast<int>(config.get_int("parallel.zero", o.parallel.zero));
  o.parallel.bucket_mb = config.get_double("parallel.bucket_mb", o.parallel.bucket_mb);
  o.parallel.backend = config.get_string("parallel.backend", o.parallel.backend);
  o.parallel.timeout_s = config.get_int("parallel.timeout_s", o.parallel.timeout_s);
  if (o.parallel.zero < 0 || o.parallel.zero > 3) {
    throw_error(
        "parallel.zero must be 0 (replicated), 1 (optimizer state sharded), 2 (gradients too) "
        "or 3 (parameters too), got {}",
        o.parallel.zero);
  }
  if (!(o.parallel.bucket_mb > 0)) {
    throw_error("parallel.bucket_mb must be positive, got {}", o.parallel.bucket_mb);
  }
  if (o.parallel.backend != "auto" && o.parallel.backend != "shm" && o.parallel.backend != "gloo" &&
      o.parallel.backend != "hierarchical") {
    throw_error("parallel.backend must be auto, shm, gloo or hierarchical, got '{}'",
                o.parallel.backend);
  }
  if (o.parallel.timeout_s < 1) {
    throw_error("parallel.timeout_s must be at least 1, got {}", o.parallel.timeout_s);
  }

  auto at_least = [](const char* key, int64_t v, int64_t min) {
    if (v < min) throw_error("{} must be at least {}, got {}", key, min, v);
  };
  at_least("train.micro_batch", o.micro_batch, 1);
  at_least("train.grad_accum", o.grad_accum, 1);
  at_least("train.steps", o.steps, 1);
  at_least("train.threads", o.threads, 0);
  at_least("train.eval_every", o.eval_every, 0);
  at_least("train.eval_windows", o.eval_windows, 0);
  at_least("train.checkpoint_every", o.checkpoint_every, 0);
  at_least("train.keep_checkpoints", o.keep_checkpoints, 1);
  at_least("train.snapshot_every", o.snapshot_every, 0);
  at_least("diag.sdc_every", o.sdc_every, 0);
  at_least("optim.warmup_steps", o.lr.warmup_steps, 0);
  // Written so that NaN fails every check.
  if (!(o.lr.lr > 0 && std::isfinite(o.lr.lr))) {
    throw_error("optim.lr must be a positive number, got {}", o.lr.lr);
  }
  if (!(o.lr.min_lr >= 0 && o.lr.min_lr <= o.lr.lr)) {
    throw_error("optim.min_lr must be in [0, optim.lr = {}], got {}", o.lr.lr, o.lr.min_lr);
  }
  if (!(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1 && o.adamw.beta2 >= 0 && o.adamw.beta2 < 1)) {
    throw_error("optim.beta1 and optim.beta2 must be in [0, 1), got {} and {}", o.adamw.beta1,
                o.adamw.beta2);
  }
  if (!(o.adamw.eps > 0)) throw_error("optim.eps must be positive, got {}", o.adamw.eps);
  if (!(o.adamw.weight_decay >= 0)) {
    throw_error("optim.weight_decay must be >= 0, got {}", o.adamw.weight_decay);
  }
  if (!(o.grad_clip >= 0)) {
    throw_error("optim.grad_clip must be >= 0 (0 turns clipping off), got {}", o.grad_clip);
  }
  if (!(o.data.val_fraction > 0 && o.data.val_fraction < 1)) {
    throw_error("data.val_fraction must be in (0, 1), got {}", o.data.val_fraction);
  }
  // Pipeline parallelism, before any worker connects or allocates.
  if (o.parallel.pp > 1 && o.parallel.zero >= 3) {
    throw_error(
        "parallel.zero = {} with parallel.pp = {}: ZeRO 3 does not run with pipeline "
        "parallelism (each micro-batch would gather every stage's parameters again, as "
        "Megatron-LM and DeepSpeed also refuse); set parallel.zero to 0, 1 or 2",
        o.parallel.zero, o.parallel.pp);
  }
  check_pipeline_shape(o.pipeline_shape());
  return o;
}

schedule::Shape TrainOptions::pipeline_shape() const {
  schedule::Shape shape;
  shape.kind = schedule::parse_kind(parallel.schedule);
  shape.stages = parallel.pp;
  shape.microbatches = grad_accum;
  shape.virtual_stages = parallel.virtual_stages;
  return shape;
}

}  // namespace brigade

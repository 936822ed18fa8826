#include "brigade/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>

#include "brigade/ckpt/async_writer.h"
#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/communicator.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "brigade/core/threads.h"
#include "brigade/data/dataset.h"
#include "brigade/data/sampler.h"
#include "brigade/data/tokenizer.h"
#include "brigade/optim/grad_clip.h"
#include "brigade/train/evaluate.h"

namespace brigade {
namespace fs = std::filesystem;

std::vector<DecayRange> decay_ranges(const ParamLayout& layout, bool decay_position_embedding) {
  std::vector<DecayRange> ranges;
  for (const ParamInfo& p : layout.params()) {
    const bool decay = p.kind == ParamKind::kMatmul || p.kind == ParamKind::kTokenEmbedding ||
                       (p.kind == ParamKind::kPositionEmbedding && decay_position_embedding);
    // Merge neighbours with the same flag (padding included), so the update
    // runs over a few long ranges rather than one per tensor.
    const int64_t end = p.offset + p.numel;
    if (!ranges.empty() && ranges.back().decay == decay) {
      ranges.back().end = end;
    } else {
      ranges.push_back({p.offset, end, decay});
    }
  }
  return ranges;
}

namespace {

// Whether `path` lies in `dir` (false for an empty dir).
bool inside(const fs::path& path, const fs::path& dir) {
  if (dir.empty()) return false;
  const fs::path p = fs::weakly_canonical(path), d = fs::weakly_canonical(dir);
  return std::mismatch(d.begin(), d.end(), p.begin(), p.end()).first == d.end();
}

std::unique_ptr<Dataset> open_or_prepare(const DataOptions& data, const GptConfig& model) {
  if (data.dir.empty()) {
    throw_error(
        "data.dir is not set: point it at a directory made by `brigade data prepare`, or "
        "set data.source to a text file and data.dir to where to prepare it");
  }
  if (!fs::exists(fs::path(data.dir) / "dataset.json")) {
    if (data.source.empty()) {
      throw_error(
          "{} holds no prepared dataset and data.source is not set: run `brigade data "
          "prepare TEXT --out {}` or set data.source",
          data.dir, data.dir);
    }
    if (!fs::exists(data.source)) {
      throw_error(
          "data.source {} does not exist (run from the repository root, or give an "
          "absolute path)",
          data.source);
    }
    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(data.tokenizer);
    prepare_dataset(data.source, *tokenizer, data.dir, data.val_fraction);
  }
  auto dataset = std::make_unique<Dataset>(data.dir);
  // A dataset prepared earlier with another tokenizer would silently train on
  // the wrong tokens.
  if (!same_tokenizer_spec(data.tokenizer, dataset->tokenizer_spec())) {
    throw_error(
        "{} was prepared with tokenizer {} but data.tokenizer is {}: delete {} to "
        "prepare it again, or set data.dir to another directory",
        data.dir, dataset->tokenizer_spec(), data.tokenizer, data.dir);
  }
  if (dataset->vocab_size() > static_cast<uint64_t>(model.vocab_size)) {
    throw_error(
        "the dataset in {} uses a vocabulary of {} tokens but model.vocab_size is {}: set "
        "model.vocab_size >= {}",
        data.dir, dataset->vocab_size(), model.vocab_size, dataset->vocab_size());
  }
  return dataset;
}

// The floats of this rank's wte.
int64_t tied_numel(const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params()) {
    if (p.offset == layout.wte()) return p.numel;
  }
  return 0;
}

}  // namespace

Trainer::Trainer(const GptConfig& model, const TrainOptions& options, Communicator* dp_group)
    : Trainer(model, options, TrainerGroups{dp_group, dp_group, nullptr}) {}

Trainer::Trainer(const GptConfig& model, const TrainOptions& options, const TrainerGroups& groups)
    : options_(options),
      dp_group_(groups.dp),
      tp_group_(groups.tp),
      world_(groups.world),
      pp_group_(groups.pp) {
  const int dp = options_.parallel.dp;
  const int tp = options_.parallel.tp;
  const int pp = options_.parallel.pp;
  // The pipeline's shape first: it is the config's to fix, whatever the groups.
  check_pipeline_shape(options_.pipeline_shape());
  const std::vector<std::vector<LayerRange>> stages =
      stage_chunks(model, options_.pipeline_shape(), options_.parallel.stage_layers);
  if (dp > 1 && (dp_group_ == nullptr || dp_group_->size() != dp)) {
    throw_error(
        "parallel.dp = {} needs {} worker processes: start them with `brigade train --nproc {} "
        "CONFIG`",
        dp, dp, dp * tp);
  }
  if (tp > 1 && (tp_group_ == nullptr || tp_group_->size() != tp || world_ == nullptr ||
                 world_->size() != dp * tp * pp)) {
    throw_error(
        "parallel.tp = {} needs a tensor-parallel group of {} ranks in a world of dp * tp * pp = "
        "{}: start the workers with `brigade train --nproc {} --set parallel.tp={} CONFIG`",
        tp, tp, dp * tp * pp, dp * tp * pp, tp);
  }
  if (pp > 1 && (pp_group_ == nullptr || pp_group_->size() != pp || world_ == nullptr ||
                 world_->size() != dp * tp * pp)) {
    throw_error(
        "parallel.pp = {} needs a pipeline group of {} ranks in a world of dp * tp * pp = {}: "
        "start the workers with `brigade train --nproc {} --set parallel.pp={} CONFIG`",
        pp, pp, dp * tp * pp, dp * tp * pp, pp);
  }
  model.validate_tensor_parallel(tp);
  if (options_.parallel.sequence_parallel) model.validate_sequence_parallel(tp);
  const int stage = pp > 1 ? pp_group_->rank() : 0;
  const std::vector<LayerRange>& chunks = stages[static_cast<size_t>(stage)];
  if (world_ == nullptr) world_ = dp_group_;
  // Find the checkpoint first: a bad --resume should fail before any work.
  std::optional<ResolvedCheckpoint> resume;
  if (!options_.resume.empty()) {
    resume = resolve_checkpoint(options_.resume, inside(options_.resume, options_.snapshot_dir));
  }
  set_num_threads(static_cast<int>(options_.threads));
  if (tp > 1) tp_ = std::make_unique<TensorParallelGroup>(*tp_group_);
  const ParamLayout layout(model, tp_rank(), tp, chunks);
  for (const ParamInfo& p : layout.params()) {
    if ((tp_rank() == 0 || !p.replicated()) && !p.tied_copy) {
      norm_ranges_.push_back({p.offset, p.offset + p.numel});
    }
  }
  if (pp > 1 && layout.wte() >= 0) {
    // Buckets up to wte's end wait (on the last stage of an interleaved
    // pipeline the chunks before the head's too).
    tied_end_ = layout.wte() + tied_numel(layout);
  }
  const auto bucket_elements =
      static_cast<int64_t>(options_.parallel.bucket_mb * 1e6 / sizeof(float));
  // Alone there is nothing to shard: every stage is ZeRO 0.
  zero_ = dp > 1 ? options_.parallel.zero : 0;
  const int zero = zero_;
  if (zero == 3) {
    // One bucket per block (and the embeddings, ln_f): the unit ZeRO 3
    // gathers before the block runs and reduces after its backward.
    std::vector<int64_t> cuts = {layout.wpe(), layout.ln_f_w()};
    for (int64_t l = 0; l < model.n_layer; ++l) cuts.push_back(layout.block(l).ln_1_w);
    plan_ = std::make_unique<BucketPlan>(layout.size(), dp, cuts);
  } else {
    plan_ = std::make_unique<BucketPlan>(layout.size(), dp, bucket_elements);
  }
  allocate_buffers(plan_->padded_size());
  model_ = std::make_unique<GptChunks>(model, params_.data(), grads_.data(), tp_.get(), chunks);
  model_->set_sequence_parallel(options_.parallel.sequence_parallel);
  stage_ = std::make_unique<PipelineStage>(pp > 1 ? pp_group_ : nullptr, *model_,
                                           options_.pipeline_shape());
  // Every rank draws the same weights from the seed (its shards of them by
  // their global indices): no broadcast needed.
  model_->init_weights(options_.seed, params_.data());
  const auto ranges = decay_ranges(layout, options_.decay_position_embedding);
  if (zero >= 1) {
    std::vector<Slice> slices;
    for (const FlatRange& r : plan_->owned(dp_rank())) slices.push_back({r.begin, r.end});
    optimizer_ = std::make_unique<AdamW>(options_.adamw, ranges, slices);
  } else {
    optimizer_ = std::make_unique<AdamW>(options_.adamw, ranges, plan_->padded_size());
  }
  if (dp > 1) {
    const GradSync::Mode mode = zero == 0   ? GradSync::Mode::kAllReduce
                                : zero == 1 ? GradSync::Mode::kReduceScatter
                                            : GradSync::Mode::kReduceScatterAndRelease;
    grad_sync_ = std::make_unique<GradSync>(*dp_group_, *plan_, grads_.data(), mode,
                                            buffers_in_shared_memory_);
  }
  saver_ = std::make_unique<CheckpointSaver>(world_, options_.parallel.timeout_s * 1000);
  require_shared_directory(world_, fs::path(options_.run_dir) / "checkpoints");
  // Every rank, with an area or not: the ranks agree (a collective) on
  // whether all of them have one (a node whose launcher could not set up
  // its area gives its workers none).
  if (options_.snapshot_every > 0) start_snapshots_if_room();
  if (zero == 3) {
    sharded_params_ = std::make_unique<ShardedParams>(*dp_group_, *plan_, params_.data(),
                                                      buffers_in_shared_memory_);
    model_->set_param_residency(sharded_params_.get());
  }
  if (!options_.data.synthetic) {
    dataset_ = open_or_prepare(options_.data, model);
    sampler_ = std::make_unique<GlobalSampler>(*dataset_, options_.seed,
                                               static_cast<int>(model.block_size));
    // Checked now rather than at the first evaluation, hours into the run.
    if (EvalWindows(dataset_->val_shard(), static_cast<int>(model.block_size)).num_windows() == 0) {
      throw_error(
          "the validation split of {} has {} tokens, fewer than block_size+1 = {}: "
          "prepare it with a larger --val-fraction or lower model.block_size",
          options_.data.dir, dataset_->val_shard().size(), model.block_size + 1);
    }
  }
  inputs_.resize(static_cast<size_t>(options_.micro_batch * model.block_size));
  targets_.resize(inputs_.size());
  if (resume) {
    load_checkpoint(*resume);
    // Every rank has read its checkpoint before rank 0 moves any step, and
    // they read the same step: ranks that each resolved "the newest" of a
    // run directory some of them see late (a network file system's cache)
    // would otherwise train different steps together, silently.
    if (world_ != nullptr && world_->size() > 1) {
      double steps[2] = {static_cast<double>(step_), -static_cast<double>(step_)};
      world_->all_reduce(steps, 2, DType::kF64, ReduceOp::kMax)->wait();
      if (steps[0] != -steps[1]) {
        throw_error(
            "the ranks resumed from different steps ({} to {}; this rank {} from {}): give "
            "--resume the step directory itself, or put the run directory on a file system "
            "every node sees the same",
            static_cast<int64_t>(-steps[1]), static_cast<int64_t>(steps[0]), step_,
            resume->dir.string());
      }
    }
    if (world_rank() == 0) set_aside_abandoned_branch();
  }
}

void Trainer::set_aside_abandoned_branch() {
  const fs::path root = fs::path(options_.run_dir) / "checkpoints";
  const std::vector<fs::path> moved = set_aside_checkpoints_after(root, step_);
  if (moved.empty()) return;
  std::string names;
  for (const fs::path& dir : moved) names += (names.empty() ? "" : ", ") + dir.filename().string();
  std::fprintf(stderr,
               "brigade: resuming at step %lld starts a new branch: moved the later checkpoints "
               "%s to %s (kept, never resumed from or pruned)\n",
               static_cast<long long>(step_), names.c_str(),
               moved.front().parent_path().string().c_str());
}

Trainer::~Trainer() {
  drop_snapshot_claim();
}

void Trainer::fill_batch(int64_t first_sample, int64_t num_samples) {
  if (sampler_) {
    sampler_->fill(step_, first_sample, num_samples, inputs_.data(), targets_.data());
    return;
  }
  // Synthetic: token i of sample j of step s is Philox(seed, s, j*(T+1)+i).
  const int64_t t = model_config().block_size;
  const uint64_t v = static_cast<uint64_t>(model_config().vocab_size);
  const uint64_t key = Philox::key(options_.seed, RngPurpose::kSyntheticTokens);
  for (int64_t j = 0; j < num_samples; ++j) {
    for (int64_t i = 0; i <= t; ++i) {
      const uint64_t index = static_cast<uint64_t>((first_sample + j) * (t + 1) + i);
      const auto token = static_cast<int32_t>(Philox::below(key, step_, index, v));
      if (i < t) inputs_[j * t + i] = token;
      if (i > 0) targets_[j * t + i - 1] = token;
    }
  }
}

int Trainer::dp_rank() const {
  return dp_group_ != nullptr ? dp_group_->rank() : 0;
}

int Trainer::tp_rank() const {
  return tp_group_ != nullptr ? tp_group_->rank() : 0;
}

int Trainer::world_rank() const {
  return world_ != nullptr ? world_->rank() : 0;
}

void Trainer::allocate_buffers(int64_t size) {
  const int64_t bytes = (size * static_cast<int64_t>(sizeof(float)) + 63) / 64 * 64;
  if (dp_group_ != nullptr && dp_group_->shared_buffer() != nullptr &&
      dp_group_->shared_buffer_bytes() >= 2 * bytes) {
    auto* base = static_cast<std::byte*>(dp_group_->shared_buffer());
    grads_ = FloatBuffer::view(reinterpret_cast<float*>(base), size);
    params_ = FloatBuffer::view(reinterpret_cast<float*>(base + bytes), size);
    grads_.zero();
    params_.zero();
    buffers_in_shared_memory_ = true;
    return;
  }
  params_ = FloatBuffer(size);
  grads_ = FloatBuffer(size);
}

int64_t shared_bytes_for_training(const GptConfig& model) {
  // Two flat buffers (gradients, parameters), padded for any dp up to 1024.
  const int64_t padded = (ParamLayout(model).size() + 1024 * BucketPlan::kAlignFloats - 1) /
                         (1024 * BucketPlan::kAlignFloats) * (1024 * BucketPlan::kAlignFloats);
  const int64_t bytes = 2 * padded * static_cast<int64_t>(sizeof(float));
  return (bytes + 4095) / 4096 * 4096;
}

double Trainer::sum_over_ranks(double value) {
  if (dp_group_ == nullptr || dp_group_->size() == 1) return value;
  const StepClock::Section comm(clock_, StepPart::kComm);
  dp_group_->all_reduce(&value, 1, DType::kF64, ReduceOp::kSum)->wait();
  return value;
}

double Trainer::global_grad_norm() {
  if (zero_ == 0 && tp_size() == 1 && pp_size() == 1) {
    return grad_norm(grads_.data(), grads_.size());
  }
  // Under ZeRO each rank holds the reduced values of its slices only, and
  // under tp its shards and copies of the replicated tensors: every element
  // is counted once, on its owner (replicated ones on tp rank 0).
  const std::vector<Slice> whole = {{0, grads_.size()}};
  const std::vector<Slice>& held = zero_ >= 1 ? optimizer_->slices() : whole;
  double squares = 0.0;
  for (const Slice& slice : held) {
    for (const Slice& counted : norm_ranges_) {
      const int64_t begin = std::max(slice.begin, counted.begin);
      const int64_t end = std::min(slice.end, counted.end);
      if (begin >= end) continue;
      const double norm = grad_norm(grads_.data() + begin, end - begin);
      squares += norm * norm;
    }
  }
  if (zero_ >= 1) squares = sum_over_ranks(squares);
  const StepClock::Section comm(clock_, StepPart::kComm);
  if (tp_size() > 1) tp_group_->all_reduce(&squares, 1, DType::kF64, ReduceOp::kSum)->wait();
  if (pp_size() > 1) pp_group_->all_reduce(&squares, 1, DType::kF64, ReduceOp::kSum)->wait();
  return std::sqrt(squares);
}

StepMetrics Trainer::forward_backward() {
  const int64_t b = options_.micro_batch, t = model_config().block_size;
  const int64_t accum = options_.grad_accum;
  // A check step's gradient replay (or a gradient flip to inject) needs
  // the local gradients whole before any of them is reduced: the reduce
  // then follows the backward instead of overlapping it. The replay of the
  // peer's micro-batches goes first, in the same buffer, so that no second
  // gradient buffer is held for it.
  const bool flip_gradient = grad_sync_ && flip_grad_step_ == step_;
  const bool local_check = grad_sync_ && local_gradients_due_ && local_gradients_due_();
  const bool reduce_after = flip_gradient || local_check;
  if (local_check) replayed_peer_ = replay_peer_gradient();
  if (zero_ >= 2 && !local_check) {
    // Only the owned slices hold values; the rest was released as zeros.
    for (const Slice& slice : optimizer_->slices()) {
      std::fill(grads_.data() + slice.begin, grads_.data() + slice.end, 0.0f);
    }
  } else {
    grads_.zero();
  }
  if (tp_) tp_->take_comm_ms();  // an evaluation's since the last step is not this step's
  if (sharded_params_) sharded_params_->take_wait_ms();
  const float loss_scale = 1.0f / static_cast<float>(options_.global_batch() * t);
  const int64_t first_sample = dp_rank() * b * accum;
  // Only the last backward reduces: the earlier ones just accumulate. The
  // tied wte's buckets wait for its gradient from the other end of the pipeline.
  const auto fill = [&](int64_t micro) {
    const StepClock::Section data(clock_, StepPart::kData);
    fill_batch(first_sample + micro * b, b);
  };
  const auto arm = [sync = reduce_after ? nullptr : grad_sync_.get()] {
    if (sync) sync->arm();
  };
  Gpt::GradReadyHook hook;
  if (grad_sync_ && !reduce_after) {
    hook = [sync = grad_sync_.get(), hold = tied_end_](int64_t from) {
      sync->on_ready(std::max(from, hold));
    };
  }
  const PipelineStepStats pipeline =
      stage_->run(fill, inputs_.data(), targets_.data(), b, t, loss_scale, arm, hook);
  // Measured inside the compute section by the layers that waited.
  clock_.move(pipeline.bubble_ms + pipeline.send_wait_ms, StepPart::kBubble);
  double loss = pipeline.loss_sum;
  if (poisoned_losses_ > 0 && poisoned_step_ == step_) {
    loss = std::numeric_limits<double>::quiet_NaN();
    --poisoned_losses_;
  }
  // The last stage computed the losses. Their sum is the first collective
  // after the lists, where a stage that finished early waits for a peer's
  // drain: bubble, so that the tied wte's sum below is its transfer alone.
  double drain_ms = 0.0;
  if (pp_size() > 1) {
    const StepClock::Section bubble(clock_, StepPart::kBubble);
    drain_ms = stage_->sum_losses_at_drain(&loss);
  }
  if (tied_end_ > 0) {
    const StepClock::Section comm(clock_, StepPart::kComm);
    const int64_t wte = layout().wte();
    stage_->sum_tied_gradients(grads_.data() + wte, tied_numel(layout()));
  }
  if (reduce_after) {
    if (flip_gradient) {
      flip_grad_step_ = -1;
      std::fprintf(stderr, "brigade train: flipped a bit of %s before the reduce\n",
                   flip_gradient_bit().c_str());
    }
    if (local_check) {
      local_gradients_check_();
      // A check that found a disagreement throws; one that let the step go
      // on must have given this rank's own gradient back.
      BRIGADE_CHECK(!local_gradient_spoiled_,
                    "the gradient replay left the step's gradient "
                    "overwritten");
    }
    grad_sync_->arm();  // finish() below reduces every bucket
  }
  StepMetrics m;
  m.step = step_;
  // All of the stage's idle time in the step, as the schedule's simulated
  // bubble (the step less the stage's busy time) counts it.
  m.bubble_ms = pipeline.bubble_ms + pipeline.send_wait_ms + drain_ms;
  m.live_microbatches = pipeline.peak_live;
  if (grad_sync_) {
    const StepClock::Section comm(clock_, StepPart::kComm);
    m.exposed_comm_ms = grad_sync_->finish();
    m.backward_end_ms = grad_sync_->backward_end_ms();
  }
  // ZeRO 3's parameter gathers that forward and backward had to wait for.
  if (sharded_params_) {
    const double waited = sharded_params_->take_wait_ms();
    clock_.move(waited, StepPart::kComm);
    m.exposed_comm_ms += waited;
  }
  if (tp_) {
    m.tp_comm_ms = tp_->take_comm_ms();
    clock_.move(m.tp_comm_ms, StepPart::kComm);
    m.exposed_comm_ms += m.tp_comm_ms;
  }
  local_loss_ = loss;
  m.loss = sum_over_ranks(loss) / static_cast<double>(accum * dp_size());
  m.grad_norm = global_grad_norm();
  return m;
}

StepMetrics Trainer::train_step() {
  Stopwatch sw;
  // What no section inside claims is compute.
  const StepClock::Section compute(clock_, StepPart::kCompute);
  if (flip_step_ == step_) {
    flip_step_ = -1;
    std::fprintf(stderr, "brigade train: flipped a bit of %s at the start of step %lld\n",
                 flip_parameter_bit().c_str(), static_cast<long long>(step_ + 1));
  }
  StepMetrics m = forward_backward();
  // Every rank agrees, so all re-run or none: the summed loss and norm are
  // one rank's view of them, and a rank that alone re-ran (or threw) would
  // leave the others waiting in a collective.
  const auto non_finite = [&] {
    double bad = std::isfinite(m.loss) && std::isfinite(m.grad_norm) ? 0.0 : 1.0;
    if (world_ != nullptr && world_->size() > 1) {
      const StepClock::Section comm(clock_, StepPart::kComm);
      world_->all_reduce(&bad, 1, DType::kF64, ReduceOp::kMax)->wait();
    }
    return bad != 0.0;
  };
  if (non_finite()) {
    const double first_loss = m.loss, first_norm = m.grad_norm;
    m = forward_backward();
    if (non_finite()) throw_non_finite(m, local_loss_);
    if (world_rank() == 0) {
      std::fprintf(stderr,
                   "brigade train: step %lld: a NaN or infinite loss or gradient norm on some "
                   "rank (here loss %g, gradient norm %g); re-ran the step on the same batch and "
                   "got loss %g: a passing fault, training goes on\n",
                   static_cast<long long>(step_ + 1), first_loss, first_norm, m.loss);
    }
  }
  m.lr = options_.lr.at(step_);
  // The update writes what an unstaged snapshot is still reading. That
  // wait and a snapshot's claim below are the saves' time (kCheckpoint),
  // left out of the step's own time (m.step_ms) as the loop's saves are.
  const int64_t save_start = now_ns();
  if (snapshot_saver_) {
    const StepClock::Section stall(clock_, StepPart::kCheckpoint);
    snapshot_saver_->wait_until_written();
  }
  int64_t save_ns = now_ns() - save_start;
  // Before the update: every replica still holds the last update's result,
  // and whatever the snapshot read has been read (and hashed, for the
  // replica check: compare_replicas).
  fused_hash_ = take_snapshot_hash();
  {
    // Never left for a later compare_replicas (a save's) if the check throws.
    struct Reset {
      std::optional<uint64_t>& hash;
      ~Reset() { hash.reset(); }
    } reset{fused_hash_};
    if (before_update_) before_update_();
  }
  std::vector<StateCopy> snapshot_copies;
  if (snapshot_saver_) {
    const StepClock::Section claim(clock_, StepPart::kCheckpoint);
    const int64_t claim_start = now_ns();
    snapshot_copies = claim_snapshot();
    save_ns += now_ns() - claim_start;
  }
  ++state_version_;  // the update (and ZeRO 1/2's gather) writes the state
  {
    const StepClock::Section update(clock_, StepPart::kOptimizer);
    const int64_t update_start = now_ns();
    // Under ZeRO 0 the update writes every replicated element: it hashes
    // them for a coming check while they are in L1 (compare_replicas).
    uint64_t hash = 0;
    const bool hashing = zero_ == 0 && replica_checks_on() && check_due_ && check_due_(step_ + 1);
    optimizer_->step(params_.data(), grads_.data(), m.lr,
                     clip_scale(m.grad_norm, options_.grad_clip), snapshot_copies,
                     hashing ? &hash : nullptr);
    update_hash_.reset();
    if (hashing) update_hash_ = UpdateHash{state_version_, hash};
    m.optimizer_ms = static_cast<double>(now_ns() - update_start) * 1e-6;
  }
  if (zero_ == 1 || zero_ == 2) {
    const StepClock::Section comm(clock_, StepPart::kComm);
    // Each rank updated its slices; gather everyone's, bucket by bucket, in
    // place. (ZeRO 3 gathers each block when the next forward needs it.)
    const int64_t gather_start = now_ns();
    std::vector<std::shared_ptr<Work>> gathers;
    for (int64_t i = 0; i < static_cast<int64_t>(plan_->buckets().size()); ++i) {
      const FlatRange mine = plan_->slice(i, dp_rank());
      gathers.push_back(dp_group_->all_gather(params_.data() + mine.begin,
                                              params_.data() + plan_->buckets()[i].begin,
                                              mine.size(), DType::kF32));
    }
    for (auto& work : gathers) work->wait();
    m.exposed_comm_ms += static_cast<double>(now_ns() - gather_start) * 1e-6;
  }
  ++step_;
  if (after_update_) after_update_();
  m.step_ms = sw.elapsed_ms() - static_cast<double>(save_ns) * 1e-6;
  m.compute_ms = m.step_ms - m.exposed_comm_ms;
  m.tokens_per_s = static_cast<double>(tokens_per_step()) / (m.step_ms * 1e-3);
  return m;
}

MemoryAccount Trainer::memory() const {
  MemoryAccount account;
  // ZeRO 3: the owned slices; a block or two more are resident while they run.
  account.params = sharded_params_ ? params_.bytes() / dp_size() : params_.bytes();
  // Sharded gradients still use the whole buffer during backward; ZeRO 2's
  // saving is what the rank keeps after the reduce-scatter.
  account.grads = zero_ >= 2 ? grads_.bytes() / dp_size() : grads_.bytes();
  account.optimizer = 2 * optimizer_->size() * static_cast<int64_t>(sizeof(float));
  // Each chunk keeps a workspace per micro-batch its schedule has alive at
  // once (1F1B up to p on the first stage, GPipe all of them), with what
  // ZB-H1's split backward keeps from B to W (activation_bytes counts it).
  const std::vector<int64_t> slots = stage_->slots_per_chunk();
  for (int64_t c = 0; c < model_->size(); ++c) {
    account.activations +=
        slots[static_cast<size_t>(c)] *
        model_->chunk(c).activation_bytes(options_.micro_batch, model_config().block_size);
  }
  return account;
}

std::vector<BucketTiming> Trainer::bucket_timings() const {
  return grad_sync_ ? grad_sync_->timings() : std::vector<BucketTiming>{};
}

double Trainer::evaluate() {
  if (!dataset_) throw_error("evaluation needs a dataset; this run uses data.synthetic = true");
  // Through the pipeline: every stage runs the same windows.
  const auto loss_of = [&](const int32_t* inputs, const int32_t* targets, int64_t b) {
    return stage_->forward_loss(inputs, targets, b, model_config().block_size);
  };
  return evaluate_windows(model_config(), loss_of, dataset_->val_shard(), options_.micro_batch,
                          options_.eval_windows, "the validation split of " + options_.data.dir)
      .loss;
}

}  // namespace brigade

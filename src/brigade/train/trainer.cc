#include "brigade/train/trainer.h"

#include <algorithm>
#include <cmath>

#include "brigade/ckpt/checkpoint.h"
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

}  // namespace

Trainer::Trainer(const GptConfig& model, const TrainOptions& options) : options_(options) {
  // Find the checkpoint first: a bad --resume should fail before any work.
  const fs::path resume_dir =
      options_.resume.empty() ? fs::path() : resolve_checkpoint(options_.resume);
  set_num_threads(static_cast<int>(options_.threads));
  const ParamLayout layout(model);
  params_ = FloatBuffer(layout.size());
  grads_ = FloatBuffer(layout.size());
  model_ = std::make_unique<Gpt>(model, params_.data(), grads_.data());
  init_gpt2_weights(layout, model.n_layer, options_.seed, params_.data());
  optimizer_ = std::make_unique<AdamW>(
      options_.adamw, decay_ranges(layout, options_.decay_position_embedding), layout.size());
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
  if (!resume_dir.empty()) load_checkpoint(resume_dir);
}

Trainer::~Trainer() = default;

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

StepMetrics Trainer::train_step() {
  Stopwatch sw;
  const int64_t b = options_.micro_batch, t = model_config().block_size;
  const int64_t n = params_.size();
  grads_.zero();
  const float loss_scale = 1.0f / static_cast<float>(options_.global_batch() * t);
  double loss = 0.0;
  for (int64_t micro = 0; micro < options_.grad_accum; ++micro) {
    fill_batch(micro * b, b);
    loss += model_->forward_backward(inputs_.data(), targets_.data(), b, t, loss_scale);
  }
  StepMetrics m;
  m.step = step_;
  m.loss = loss / static_cast<double>(options_.grad_accum);
  m.grad_norm = grad_norm(grads_.data(), n);
  if (!std::isfinite(m.grad_norm)) {
    throw_error(
        "step {}: the gradient norm is {} (loss {}): training diverged; lower optim.lr or "
        "resume from an earlier checkpoint",
        step_, m.grad_norm, m.loss);
  }
  m.lr = options_.lr.at(step_);
  optimizer_->step(params_.data(), grads_.data(), m.lr,
                   clip_scale(m.grad_norm, options_.grad_clip));
  ++step_;
  m.step_ms = sw.elapsed_ms();
  m.tokens_per_s = static_cast<double>(tokens_per_step()) / (m.step_ms * 1e-3);
  return m;
}

double Trainer::evaluate() {
  if (!dataset_) throw_error("evaluation needs a dataset; this run uses data.synthetic = true");
  return evaluate_windows(*model_, dataset_->val_shard(), options_.micro_batch,
                          options_.eval_windows, "the validation split of " + options_.data.dir)
      .loss;
}

nlohmann::json Trainer::state_json() const {
  return {{"step", step_},
          {"optimizer_step", optimizer_->step_count()},
          {"seed", options_.seed},
          {"global_batch", options_.global_batch()},
          {"lr_schedule",
           {{"lr", options_.lr.lr},
            {"min_lr", options_.lr.min_lr},
            {"warmup_steps", options_.lr.warmup_steps},
            {"total_steps", options_.lr.total_steps}}},
          {"sampler", {{"kind", "philox_windows"}, {"seed", options_.seed}, {"next_step", step_}}},
          {"dataset", dataset_ ? dataset_->dir().string() : "synthetic"}};
}

fs::path Trainer::save_checkpoint() {
  const fs::path root = fs::path(options_.run_dir) / "checkpoints";
  CheckpointView view{params_.data(), optimizer_->m().data(), optimizer_->v().data(), state_json(),
                      dataset_ ? dataset_->tokenizer_spec() : ""};
  const fs::path dir = brigade::save_checkpoint(root, step_, model_config(), view);
  prune_checkpoints(root, options_.keep_checkpoints);
  return dir;
}

void Trainer::load_checkpoint(const fs::path& path) {
  const fs::path dir = resolve_checkpoint(path);
  // Load into fresh buffers first, so a failure leaves this trainer intact.
  const int64_t size = params_.size();
  FloatBuffer p(size), m(size), v(size);
  const nlohmann::json state =
      brigade::load_checkpoint(dir, model_config(), {p.data(), m.data(), v.data()});
  const auto field = [&](const char* key) {
    if (!state.contains(key) || !state[key].is_number_integer()) {
      throw_error("checkpoint {} lacks trainer_state.{}: it was not written by brigade train",
                  dir.string(), key);
    }
    return state[key].get<int64_t>();
  };
  const auto seed = static_cast<uint64_t>(field("seed"));
  const int64_t step = field("step"), optimizer_step = field("optimizer_step");
  if (state.contains("global_batch") && field("global_batch") != options_.global_batch()) {
    throw_error(
        "checkpoint {} was trained with a global batch of {} sequences but the config gives "
        "train.micro_batch * train.grad_accum = {}: the data order and learning-rate schedule "
        "assume the same global batch; choose micro_batch and grad_accum whose product is {}",
        dir.string(), field("global_batch"), options_.global_batch(), field("global_batch"));
  }
  if (seed != options_.seed) {
    throw_error(
        "checkpoint {} was trained with train.seed = {} but the config says {}: the data "
        "order would change; set train.seed = {}",
        dir.string(), seed, options_.seed, seed);
  }
  std::copy(p.data(), p.data() + size, params_.data());
  std::copy(m.data(), m.data() + size, optimizer_->m().data());
  std::copy(v.data(), v.data() + size, optimizer_->v().data());
  step_ = step;
  optimizer_->set_step_count(optimizer_step);
}

}  // namespace brigade

// The single-process trainer: one model, one optimizer, one data stream.
// It owns the three flat buffers (parameters, gradients, AdamW moments) and
// runs optimizer steps; reporting, progress and files for the user are the
// CLI's job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "brigade/core/aligned_buffer.h"
#include "brigade/model/gpt.h"
#include "brigade/optim/adamw.h"
#include "brigade/train/train_options.h"

namespace brigade {

class Dataset;
class GlobalSampler;

struct StepMetrics {
  int64_t step = 0;   // 0-based index of the step just taken
  double loss = 0.0;  // mean training loss over the global batch
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
};

class Trainer {
 public:
  // Opens (or prepares) the data, initialises the model, and if
  // options.resume is set, loads that checkpoint.
  Trainer(const GptConfig& model, const TrainOptions& options);
  ~Trainer();

  // One optimizer step over the global batch of step `step()`.
  StepMetrics train_step();
  // Mean validation loss over options.eval_windows windows (all if 0).
  double evaluate();

  // Saves to <run_dir>/checkpoints/step_<N> and prunes old ones.
  std::filesystem::path save_checkpoint();
  // Loads a checkpoint or the newest one in a run directory.
  void load_checkpoint(const std::filesystem::path& path);

  int64_t step() const { return step_; }  // steps completed
  const GptConfig& model_config() const { return model_->config(); }
  const TrainOptions& options() const { return options_; }
  const FloatBuffer& params() const { return params_; }
  Gpt& model() { return *model_; }
  const Dataset* dataset() const { return dataset_.get(); }  // null when synthetic
  int64_t tokens_per_step() const { return options_.global_batch() * model_config().block_size; }

  // State for checkpoints beyond the buffers: step, seed, schedule.
  nlohmann::json state_json() const;

 private:
  // Fills inputs_/targets_ with samples [first, first+num) of this step's
  // global batch.
  void fill_batch(int64_t first_sample, int64_t num_samples);

  TrainOptions options_;
  FloatBuffer params_, grads_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<GlobalSampler> sampler_;
  std::vector<int32_t> inputs_, targets_;  // one micro-batch, (B,T) each
  int64_t step_ = 0;
};

// Which ranges of the flat buffer get weight decay: matmul weights and the
// token embedding (it is also the LM head's matrix); not biases, not
// LayerNorm, and the position table only if asked.
std::vector<DecayRange> decay_ranges(const ParamLayout& layout, bool decay_position_embedding);

}  // namespace brigade

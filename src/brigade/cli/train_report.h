// What `brigade train`'s rank 0 writes for the user (cli/cmd_train.cc): the
// run directory's config, metrics.jsonl (one line per step: the step's
// metrics, every rank's breakdown and peak RSS, the gradient buckets, the
// saves that finished), the straggler records in incidents.jsonl, the
// start-up summary and the progress line on stderr.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "brigade/ckpt/async_writer.h"
#include "brigade/core/config.h"
#include "brigade/core/files.h"
#include "brigade/model/gpt_config.h"
#include "brigade/train/rank_stats.h"
#include "brigade/train/train_options.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {

// The progress line: rewritten in place on a terminal, every 10th step
// otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(int64_t total_steps);

  // breakdown: where the step's time went, "compute 71% comm 12% ...".
  void update(const StepMetrics& m, double mfu, const std::string& breakdown);
  // Prints a message on its own line without garbling the progress line.
  void note(const std::string& message);

 private:
  int64_t total_steps_;
  bool tty_;
  double ema_ms_ = 0;
};

// What rank 0 writes for the user: the run directory's config and
// metrics.jsonl, the start-up summary and the progress line.
class RunReport {
 public:
  // Writes the config, prints the summary, measures (or takes) the
  // machine's peak and opens metrics.jsonl.
  RunReport(const Config& config, const GptConfig& model, const TrainOptions& options,
            const Trainer& trainer);

  // The machine's peak per rank the report's MFU is against.
  double rank_peak_gflops() const { return rank_peak_gflops_; }

  // Returns the step's MFU.
  // ranks: every rank's breakdown, peak RSS and straggler episodes
  // (train/rank_stats.h); rank 0's breakdown is this process's.
  double step(const StepMetrics& m, const std::vector<BucketTiming>& bucket_timings,
              const RankStepStats& ranks,
              const std::optional<AsyncCheckpointWriter::Stats>& checkpoint,
              const std::optional<AsyncCheckpointWriter::Stats>& snapshot, double loop_ms,
              const std::vector<double>& bubble_ms_per_stage);

  void validation(int64_t step, double val_loss);
  void note(const std::string& message) { progress_.note(message); }

 private:
  std::filesystem::path incidents_path_;
  ProgressLine progress_;
  std::unique_ptr<AppendFile> metrics_;  // run_dir/metrics.jsonl
  double peak_gflops_ = 0;
  double rank_peak_gflops_ = 0;
  double flops_per_step_ = 0;
};

// Per pipeline stage, the bubble of its dp 0, tp 0 rank (world ranks are
// stage-major: parallel/mesh.h); empty without a pipeline.
std::vector<double> stage_bubbles(const std::vector<double>& per_rank, const Trainer& trainer);

}  // namespace brigade::cli

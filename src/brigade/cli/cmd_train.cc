// brigade train CONFIG [--set section.key=value ...] [--resume PATH]
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/cli/commands.h"
#include "brigade/cli/load_config.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/process_stats.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/sgemm_peak.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

std::atomic<bool> g_stop_requested{false};
void request_stop(int) {
  g_stop_requested = true;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// Refuses to start a fresh run on top of an earlier run's checkpoints, which
// it would overwrite and prune.
void check_run_dir_is_free(const TrainOptions& options) {
  if (!options.resume.empty()) return;
  if (auto latest = latest_checkpoint(fs::path(options.run_dir) / "checkpoints")) {
    throw_error(
        "{} already holds checkpoints (newest: {}): pass --resume {} to continue that run, "
        "or set train.run_dir to a new directory",
        options.run_dir, latest->filename().string(), options.run_dir);
  }
}

class ProgressLine {
 public:
  explicit ProgressLine(int64_t total_steps)
      : total_steps_(total_steps), tty_(isatty(fileno(stderr)) != 0) {}

  void update(const StepMetrics& m, double mfu) {
    // Smooth the step time so the ETA does not jump with every step.
    ema_ms_ = ema_ms_ == 0 ? m.step_ms : 0.9 * ema_ms_ + 0.1 * m.step_ms;
    const double eta_s = static_cast<double>(total_steps_ - m.step - 1) * ema_ms_ * 1e-3;
    const std::string line = fmt::format(
        "step {:>6}/{} | loss {:.4f} | lr {:.2e} | {:>8.0f} tok/s | MFU {:5.1f}% | "
        "{:.0f} ms/step | ETA {}",
        m.step + 1, total_steps_, m.loss, m.lr, m.tokens_per_s, 100.0 * mfu, m.step_ms,
        format_duration(eta_s));
    const bool last = m.step + 1 == total_steps_;
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), last ? "\n" : "");
    } else if (m.step == 0 || last || (m.step + 1) % 10 == 0) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  // Prints a message on its own line without garbling the progress line.
  void note(const std::string& message) {
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", message.c_str());
    std::fflush(stderr);
  }

 private:
  int64_t total_steps_;
  bool tty_;
  double ema_ms_ = 0;
};

void run_train(const std::string& config_path, const std::vector<std::string>& overrides,
               const std::string& resume) {
  Config config = load_config(config_path, overrides);
  const GptConfig model = GptConfig::from_config(config);
  TrainOptions options = TrainOptions::from_config(config);
  config.check_all_used();
  if (!resume.empty()) options.resume = resume;
  check_run_dir_is_free(options);

  Trainer trainer(model, options);
  const fs::path run_dir = options.run_dir;
  fs::create_directories(run_dir);
  // A resume records its own config beside the first one, never over it.
  const std::string config_name =
      trainer.step() == 0 ? std::string("config.toml")
                          : fmt::format("config.resumed_at_step_{}.toml", trainer.step());
  write_file_atomic(run_dir / config_name, config.to_toml() + "\n");

  const double peak_gflops = cpu::measure_sgemm_peak_gflops();
  const double flops_per_step = model.train_flops_per_token(model.block_size) *
                                static_cast<double>(trainer.tokens_per_step());
  const int64_t param_bytes = trainer.params().bytes();
  std::fprintf(stderr,
               "brigade train: %lld parameters (%.1f MB each for weights, grads, 2x AdamW), "
               "activations %.1f MB, %lld tokens/step, %d threads, sgemm peak %.1f GFLOP/s\n",
               static_cast<long long>(model.num_params()), param_bytes / 1e6,
               trainer.model().activation_bytes(options.micro_batch, model.block_size) / 1e6,
               static_cast<long long>(trainer.tokens_per_step()), num_threads(), peak_gflops);
  if (trainer.step() > 0) {
    std::fprintf(stderr, "resumed at step %lld from %s\n", static_cast<long long>(trainer.step()),
                 options.resume.c_str());
  }

  std::ofstream metrics(run_dir / "metrics.jsonl", std::ios::app);
  if (!metrics) throw_error("cannot append to {}", (run_dir / "metrics.jsonl").string());
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);

  ProgressLine progress(options.steps);
  auto evaluate = [&](int64_t step) {
    const double val_loss = trainer.evaluate();
    progress.note(fmt::format("step {}: validation loss {:.4f}", step, val_loss));
    metrics << nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump() << "\n" << std::flush;
    return val_loss;
  };
  while (trainer.step() < options.steps && !g_stop_requested) {
    const StepMetrics m = trainer.train_step();
    const double mfu = flops_per_step / (m.step_ms * 1e-3) / (peak_gflops * 1e9);
    metrics << nlohmann::json{{"step", m.step + 1},
                              {"loss", m.loss},
                              {"lr", m.lr},
                              {"grad_norm", m.grad_norm},
                              {"tokens_per_s", m.tokens_per_s},
                              {"step_ms", m.step_ms},
                              {"mfu", mfu},
                              {"peak_rss_bytes", peak_rss_bytes()}}
                   .dump()
            << "\n";
    progress.update(m, mfu);
    const int64_t done = trainer.step();
    if (options.eval_every > 0 && done % options.eval_every == 0 && done < options.steps) {
      evaluate(done);
    }
    if (options.checkpoint_every > 0 && done % options.checkpoint_every == 0 &&
        done < options.steps) {
      progress.note("saved " + trainer.save_checkpoint().string());
    }
  }
  metrics.flush();
  if (g_stop_requested) {
    progress.note(fmt::format("interrupted at step {}; saving a checkpoint", trainer.step()));
    progress.note("saved " + trainer.save_checkpoint().string());
    std::exit(130);
  }
  // Save before the final evaluation: the trained state is what matters.
  progress.note("saved " + trainer.save_checkpoint().string());
  if (trainer.dataset() != nullptr) evaluate(trainer.step());
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto resume = std::make_shared<std::string>();
  cmd->add_option("config", *config_path, "Config file (see examples/)")->required();
  cmd->add_option("--set", *overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--resume", *resume, "Continue from a run or checkpoint directory");
  cmd->callback([=] { run_train(*config_path, *overrides, *resume); });
}

}  // namespace brigade::cli

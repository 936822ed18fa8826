#include "brigade/cli/train_report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/process_stats.h"
#include "brigade/core/threads.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incidents.h"
#include "brigade/elastic/snapshots.h"
#include "brigade/kernels/cpu/fma_peak.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa.h"
#include "brigade/kernels/cpu/sgemm_peak.h"
#include "brigade/parallel/pipeline_stage.h"
#include "brigade/schedule/simulate.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// The machine's peak per rank: measured (0.6 s or more), or the one the
// job's first generation measured when the agent restarted this one.
cpu::MachinePeak measured_or_given_peak() {
  const char* given = std::getenv(elastic::kMachinePeakVariable);
  if (given == nullptr) return cpu::machine_peak(num_threads(), cpu::measure_sgemm_peak_gflops());
  char* end = nullptr;
  const double gflops = std::strtod(given, &end);
  if (*given == '\0' || *end != '\0' || !std::isfinite(gflops) || gflops <= 0) {
    throw_error(
        "{}='{}' is not a machine peak in GFLOP/s (> 0): brigade launch sets it for restarted "
        "workers; unset it to measure the peak",
        elastic::kMachinePeakVariable, given);
  }
  cpu::MachinePeak peak;
  peak.gflops = gflops;
  peak.source = "given";
  peak.description =
      fmt::format("the peak the job's first generation measured = {:.0f} GFLOP/s", gflops);
  return peak;
}

nlohmann::json straggler_json(const StragglerEvent& e) {
  return {{"kind", e.started ? "straggler" : "straggler_recovered"},
          {"restart", false},
          {"rank", e.rank},
          {"node", e.node},
          {"section", e.section},
          {"ratio", e.ratio},
          {"on_cpu_ms", e.on_cpu_ms},
          {"peers_on_cpu_ms", e.peers_on_cpu_ms},
          {"compute_ms", e.compute_ms},
          {"runqueue_ms", e.runqueue_ms},
          {"first_step", e.first_step},
          {"last_step", e.last_step},
          {"what", e.line()},
          // When rank 0 named it (or saw it end), for the run's trace, and
          // on which machine (diag/trace_incidents.h).
          {"unix_us", unix_us_now()},
          {"boot_id", boot_id()}};
}

// The step's breakdown (this rank's, whose parts sum to its step_ms: the
// loop iteration's wall time, train_step and what the loop did around
// it), every rank's as one array per part ("compute_ms_per_rank", by
// world rank: brigade report charts each; compute's is the straggler
// signal), and the straggler episodes that started or ended.
void add_breakdown(nlohmann::json& line, const RankStepStats& ranks) {
  const StepBreakdown& mine = ranks.breakdown.front();
  line["breakdown"] = {{"step_ms", mine.step_ms},
                       {"compute_runqueue_ms", mine.compute_runqueue_ms},
                       {"process_cpu_ms", mine.process_cpu_ms}};
  for (int i = 0; i < kStepParts; ++i) {
    line["breakdown"][fmt::format("{}_ms", step_part_name(static_cast<StepPart>(i)))] =
        mine.ms[static_cast<size_t>(i)];
  }
  if (ranks.breakdown.size() > 1) {
    const auto per_rank = [&](const std::string& key, const auto& value) {
      nlohmann::json values = nlohmann::json::array();
      for (const StepBreakdown& b : ranks.breakdown) values.push_back(value(b));
      line[key + "_per_rank"] = std::move(values);
    };
    per_rank("step_ms", [](const StepBreakdown& b) { return b.step_ms; });
    per_rank("compute_runqueue_ms", [](const StepBreakdown& b) { return b.compute_runqueue_ms; });
    per_rank("process_cpu_ms", [](const StepBreakdown& b) { return b.process_cpu_ms; });
    for (int i = 0; i < kStepParts; ++i) {
      const auto part = static_cast<StepPart>(i);
      per_rank(fmt::format("{}_ms", step_part_name(part)),
               [part](const StepBreakdown& b) { return b[part]; });
    }
  }
  if (!ranks.stragglers.empty()) {
    line["stragglers"] = nlohmann::json::array();
    for (const StragglerEvent& e : ranks.stragglers) {
      line["stragglers"].push_back(straggler_json(e));
    }
  }
}

}  // namespace

ProgressLine::ProgressLine(int64_t total_steps)
    : total_steps_(total_steps), tty_(isatty(fileno(stderr)) != 0) {}

void ProgressLine::update(const StepMetrics& m, double mfu, const std::string& breakdown) {
  // Smooth the step time so the ETA does not jump with every step.
  ema_ms_ = ema_ms_ == 0 ? m.step_ms : 0.9 * ema_ms_ + 0.1 * m.step_ms;
  const double eta_s = static_cast<double>(total_steps_ - m.step - 1) * ema_ms_ * 1e-3;
  const std::string line = fmt::format(
      "step {:>6}/{} | loss {:.4f} | lr {:.2e} | {:>8.0f} tok/s | MFU {:5.1f}% | "
      "{:.0f} ms/step | ETA {} | {}",
      m.step + 1, total_steps_, m.loss, m.lr, m.tokens_per_s, 100.0 * mfu, m.step_ms,
      format_duration(eta_s), breakdown);
  const bool last = m.step + 1 == total_steps_;
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), last ? "\n" : "");
  } else if (m.step == 0 || last || (m.step + 1) % 10 == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void ProgressLine::note(const std::string& message) {
  std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", message.c_str());
  std::fflush(stderr);
}

RunReport::RunReport(const Config& config, const GptConfig& model, const TrainOptions& options,
                     const Trainer& trainer)
    : progress_(options.steps) {
  const fs::path run_dir = options.run_dir;
  fs::create_directories(run_dir);
  // A resume records its own config beside the first one, never over it.
  const std::string config_name =
      trainer.step() == 0 ? std::string("config.toml")
                          : fmt::format("config.resumed_at_step_{}.toml", trainer.step());
  write_file_atomic(run_dir / config_name, config.to_toml() + "\n");

  // Every worker has the same cores, so one's peak times the ranks is the job's.
  const int world = trainer.dp_size() * trainer.tp_size() * trainer.pp_size();
  const cpu::MachinePeak peak = measured_or_given_peak();
  rank_peak_gflops_ = peak.gflops;
  peak_gflops_ = peak.gflops * world;
  const std::string ranks = world > 1 ? fmt::format("{} ranks x ", world) : "";
  const std::string mesh =
      trainer.pp_size() > 1 ? fmt::format("mesh dp {} x tp {} x pp {}", trainer.dp_size(),
                                          trainer.tp_size(), trainer.pp_size())
      : trainer.tp_size() > 1
          ? fmt::format("mesh dp {} x tp {}", trainer.dp_size(), trainer.tp_size())
          : fmt::format("dp {}", trainer.dp_size());
  flops_per_step_ = model.train_flops_per_token(model.block_size) *
                    static_cast<double>(trainer.tokens_per_step());
  const MemoryAccount memory = trainer.memory();
  std::fprintf(stderr,
               "brigade train: %lld parameters, %lld tokens/step, %s, ZeRO %d, %d threads "
               "per rank\n"
               "  per rank: parameters %.1f MB, gradients %.1f MB, optimizer state %.1f MB, "
               "activations %.1f MB (estimate)\n"
               "  cpu: %s; GEMMs: %s\n"
               "  MFU is against %s%s\n",
               static_cast<long long>(model.num_params()),
               static_cast<long long>(trainer.tokens_per_step()), mesh.c_str(),
               options.parallel.zero, num_threads(), memory.params / 1e6, memory.grads / 1e6,
               memory.optimizer / 1e6, memory.activations / 1e6, cpu::describe_cpu().c_str(),
               cpu::gemm_backend().c_str(), ranks.c_str(), peak.description.c_str());
  if (trainer.pp_size() > 1) {
    // The schedule's own bubble: its lists simulated with equal stages,
    // backward twice forward, free transfers.
    const schedule::Shape shape = options.pipeline_shape();
    const schedule::Simulation sim =
        schedule::simulate(schedule::all_stage_instructions(shape), schedule::Costs{}, false);
    std::string stages;
    for (const std::vector<LayerRange>& chunks :
         stage_chunks(model, shape, options.parallel.stage_layers)) {
      std::string ranges;
      for (const LayerRange& r : chunks) {
        ranges += fmt::format("{}[{}, {})", ranges.empty() ? "" : "+", r.begin, r.end);
      }
      stages += (stages.empty() ? "" : " ") + ranges;
    }
    std::fprintf(stderr,
                 "  pipeline: %s over %d stages (blocks %s), %lld micro-batches; theoretical "
                 "bubble %.1f%% of the step\n",
                 schedule::kind_name(shape.kind), trainer.pp_size(), stages.c_str(),
                 static_cast<long long>(shape.microbatches), 100.0 * sim.stages[0].bubble_fraction);
  }
  if (trainer.step() > 0) {
    std::fprintf(stderr, "resumed at step %lld from %s\n", static_cast<long long>(trainer.step()),
                 options.resume.c_str());
  }
  incidents_path_ = run_dir / "incidents.jsonl";
  metrics_ = std::make_unique<AppendFile>(run_dir / "metrics.jsonl");
}

double RunReport::step(const StepMetrics& m, const std::vector<BucketTiming>& bucket_timings,
                       const RankStepStats& ranks,
                       const std::optional<AsyncCheckpointWriter::Stats>& checkpoint,
                       const std::optional<AsyncCheckpointWriter::Stats>& snapshot, double loop_ms,
                       const std::vector<double>& bubble_ms_per_stage) {
  const std::vector<double>& peak_rss_per_rank = ranks.peak_rss_bytes;
  const double mfu = flops_per_step_ / (m.step_ms * 1e-3) / (peak_gflops_ * 1e9);
  nlohmann::json line = {{"step", m.step + 1},
                         {"loss", m.loss},
                         {"lr", m.lr},
                         {"grad_norm", m.grad_norm},
                         {"tokens_per_s", m.tokens_per_s},
                         {"step_ms", m.step_ms},
                         {"compute_ms", m.compute_ms},
                         {"exposed_comm_ms", m.exposed_comm_ms},
                         {"exposed_comm_fraction", m.exposed_comm_ms / m.step_ms},
                         {"tp_comm_ms", m.tp_comm_ms},
                         {"mfu", mfu},
                         {"optimizer_ms", m.optimizer_ms},
                         {"peak_rss_bytes", peak_rss_bytes()}};
  add_breakdown(line, ranks);
  if (bubble_ms_per_stage.size() > 1) line["bubble_ms_per_stage"] = bubble_ms_per_stage;
  if (peak_rss_per_rank.size() > 1) {
    line["peak_rss_bytes_per_rank"] = nlohmann::json::array();
    for (double bytes : peak_rss_per_rank) {
      line["peak_rss_bytes_per_rank"].push_back(static_cast<int64_t>(bytes));
    }
  }
  // One trace event per gradient bucket: when it was handed to the
  // communicator and when its reduction finished, ms after the last micro-batch began.
  nlohmann::json buckets = nlohmann::json::array();
  for (const BucketTiming& b : bucket_timings) {
    buckets.push_back({{"bytes", b.bytes}, {"issued_ms", b.issued_ms}, {"done_ms", b.done_ms}});
  }
  if (!buckets.empty()) {
    line["buckets"] = std::move(buckets);
    line["backward_end_ms"] = m.backward_end_ms;  // the buckets' clock
  }
  // The wall time since the previous step ended: this step and what the
  // loop did around it (saves' copies, waits for a snapshot, evaluation).
  if (loop_ms > 0) line["loop_ms"] = loop_ms;
  // A background save that finished during this step: what it cost.
  auto save_json = [](const AsyncCheckpointWriter::Stats& s) {
    return nlohmann::json{{"step", s.step},
                          {"rank0_bytes", s.bytes},
                          {"blocking_ms", s.blocking_ms},
                          {"write_ms", s.write_ms},
                          {"write_cpu_ms", s.write_cpu_ms}};
  };
  if (checkpoint) line["checkpoint"] = save_json(*checkpoint);
  if (snapshot) line["snapshot"] = save_json(*snapshot);
  metrics_->append_line(line.dump());
  progress_.update(m, mfu, ranks.breakdown.front().percentages());
  for (const StragglerEvent& e : ranks.stragglers) {
    progress_.note(e.line());
    // Beside the agent's incidents, which people read for what went
    // wrong; no restart, so readers of recoveries (brigade ettr) pass over it.
    try {
      elastic::append_json_line(incidents_path_, straggler_json(e));
    } catch (const Error& error) {
      progress_.note(fmt::format("brigade train: {}", error.what()));
    }
  }
  return mfu;
}

void RunReport::validation(int64_t step, double val_loss) {
  progress_.note(fmt::format("step {}: validation loss {:.4f}", step, val_loss));
  metrics_->append_line(nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump());
}

// Per pipeline stage, the bubble of its dp 0, tp 0 rank (world ranks are
// stage-major: parallel/mesh.h).
std::vector<double> stage_bubbles(const std::vector<double>& per_rank, const Trainer& trainer) {
  std::vector<double> stages;
  if (trainer.pp_size() == 1) return stages;
  const size_t per_stage = per_rank.size() / static_cast<size_t>(trainer.pp_size());
  for (size_t s = 0; s < static_cast<size_t>(trainer.pp_size()); ++s) {
    stages.push_back(per_rank[s * per_stage]);
  }
  return stages;
}

}  // namespace brigade::cli

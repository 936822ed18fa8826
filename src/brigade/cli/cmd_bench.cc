// brigade bench train CONFIG [--steps N] [--warmup N] [--threads N] [--json]
// Times optimizer steps of the configured model on synthetic tokens (speed
// does not depend on the text) and reports tokens/s, MFU against this
// machine's peak (the FMA peak, or the measured sgemm when that is higher;
// kernels/cpu/fma_peak.h), and peak memory. bench/compare_train.py runs
// it beside the PyTorch peer and prints the ratios.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/cli/load_config.h"
#include "brigade/core/process_stats.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/fma_peak.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa.h"
#include "brigade/kernels/cpu/sgemm_peak.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {
namespace {

struct BenchTrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = 10;
  int64_t warmup = 2;
  int threads = 0;
  bool json = false;
};

void run_bench_train(const BenchTrainArgs& args) {
  Config config = load_config(args.config, args.overrides);
  config.set("data.synthetic=true");
  config.set(fmt::format("train.threads={}", args.threads));
  const GptConfig model = GptConfig::from_config(config);
  TrainOptions options = TrainOptions::from_config(config);
  config.check_all_used();
  options.resume.clear();
  options.steps = args.warmup + args.steps;
  options.lr.total_steps = options.steps;

  Trainer trainer(model, options);
  const double sgemm_gflops = cpu::measure_sgemm_peak_gflops();
  const cpu::MachinePeak peak = cpu::machine_peak(num_threads(), sgemm_gflops);
  for (int64_t i = 0; i < args.warmup; ++i) trainer.train_step();
  std::vector<double> step_ms;
  for (int64_t i = 0; i < args.steps; ++i) step_ms.push_back(trainer.train_step().step_ms);
  std::sort(step_ms.begin(), step_ms.end());
  const double median_ms = step_ms[step_ms.size() / 2];
  const double tokens_per_s = static_cast<double>(trainer.tokens_per_step()) / (median_ms * 1e-3);
  const double achieved_gflops =
      model.train_flops_per_token(model.block_size) * tokens_per_s * 1e-9;
  const int64_t peak_rss = peak_rss_bytes();
  const nlohmann::json result = {{"impl", "brigade"},
                                 {"tokens_per_s", tokens_per_s},
                                 {"step_ms", median_ms},
                                 {"mfu", achieved_gflops / peak.gflops},
                                 {"achieved_gflops", achieved_gflops},
                                 {"peak_gflops", peak.gflops},
                                 {"peak_source", peak.source},
                                 {"peak_description", peak.description},
                                 {"fma_peak_gflops", peak.fma.gflops},
                                 {"sgemm_peak_gflops", sgemm_gflops},
                                 {"cpu", cpu::describe_cpu()},
                                 {"gemm_backend", cpu::gemm_backend()},
                                 {"peak_rss_bytes", peak_rss},
                                 {"threads", num_threads()},
                                 {"params", model.num_params()},
                                 {"micro_batch", options.micro_batch},
                                 {"seq_len", model.block_size},
                                 {"steps", args.steps}};
  if (args.json) {
    std::printf("%s\n", result.dump().c_str());
    return;
  }
  std::printf(
      "model: %lld params, %lld layers, n_embd %lld, vocab %lld; batch %lld x %lld tokens; "
      "%d threads\n",
      static_cast<long long>(model.num_params()), static_cast<long long>(model.n_layer),
      static_cast<long long>(model.n_embd), static_cast<long long>(model.vocab_size),
      static_cast<long long>(options.micro_batch * options.grad_accum),
      static_cast<long long>(model.block_size), num_threads());
  std::printf("median step  %10.1f ms  (min %.1f, max %.1f, %lld steps)\n", median_ms,
              step_ms.front(), step_ms.back(), static_cast<long long>(args.steps));
  std::printf("throughput   %10.0f tokens/s\n", tokens_per_s);
  std::printf("cpu          %s; GEMMs: %s\n", cpu::describe_cpu().c_str(),
              cpu::gemm_backend().c_str());
  std::printf("compute      %10.1f GFLOP/s: MFU %.1f%% of the %s (measured sgemm: %.1f)\n",
              achieved_gflops, 100.0 * achieved_gflops / peak.gflops, peak.description.c_str(),
              sgemm_gflops);
  std::printf("peak RSS     %10.1f MiB\n", static_cast<double>(peak_rss) / (1 << 20));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Measure what this machine delivers");
  bench->require_subcommand(1);
  auto* train = bench->add_subcommand("train", "Training throughput of a config");
  auto args = std::make_shared<BenchTrainArgs>();
  train->add_option("config", args->config, "Config file")->required();
  train->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  train->add_option("--steps", args->steps, "Timed steps")->check(CLI::PositiveNumber);
  train->add_option("--warmup", args->warmup, "Untimed steps first")->check(CLI::NonNegativeNumber);
  train->add_option("--threads", args->threads, "CPU threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--json", args->json, "Print one JSON line");
  train->callback([args] { run_bench_train(*args); });
  add_bench_comm_command(*bench);
  add_bench_calibrate_command(*bench);
}

}  // namespace brigade::cli

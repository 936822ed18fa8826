// brigade plan --model PRESET|CONFIG --gpus N --hardware DEVICE   best layouts, why others lost,
//                                                                 checkpoint interval and ETTR
// brigade plan ... --layout tp=8,pp=8,dp=6,...                    one layout, evaluated
// brigade plan --model CONFIG --gpus N --layout config [--set K=V]  the layout `brigade train
//                                                                 --nproc N CONFIG` runs as
// brigade plan ... --sweep-gpus 1024:16384                        how scale changes MFU and waiting
// brigade plan --validate                                         the model against published runs
// --json prints the same results as one JSON document.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/cli/load_config.h"
#include "brigade/cli/training_layout.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/sim/failure_model.h"
#include "brigade/sim/model_presets.h"
#include "brigade/sim/plan_report.h"
#include "brigade/sim/search.h"
#include "brigade/sim/sweep.h"
#include "brigade/sim/this_machine.h"
#include "brigade/sim/validation.h"

namespace brigade::cli {
namespace {

struct PlanArgs {
  std::string model;
  int64_t gpus = 0;
  std::string hardware = "h100-80g";
  int64_t global_batch = 0;  // 0: the preset's (or the config's)
  int64_t seq = 0;           // 0: the preset's (or block_size)
  std::string layout;
  std::vector<std::string> overrides;  // --set, applied to a config --model
  std::string system;                  // empty: brigade-cpu on this-machine, current elsewhere
  std::string sweep_gpus;
  std::string calibration;
  // this-machine across nodes: how many, their links, and whether they are
  // namespaces of this one machine (scripts/fake_cluster.sh).
  int64_t nodes = 1;
  std::string link;
  bool one_machine = false;
  bool json = false;
  bool validate = false;
  size_t top = 5;
  sim::FailureOptions failure;
};

sim::Workload workload_from(const PlanArgs& args) {
  sim::Workload job;
  if (sim::find_model_preset(args.model)) {
    if (!args.overrides.empty()) {
      throw_error("--set changes a config file, but --model {} is a preset", args.model);
    }
    job = sim::preset_workload(args.model);
  } else if (std::filesystem::exists(args.model)) {
    Config config = load_config(args.model, args.overrides);
    job.model = GptConfig::from_config(config);
    job.seq_len = job.model.block_size;
    job.global_batch = config.get_int("train.micro_batch", 8) *
                       config.get_int("train.grad_accum", 1) * config.get_int("parallel.dp", 1);
  } else {
    std::string names;
    for (const sim::ModelPreset& p : sim::model_presets()) names += " " + p.name;
    throw_error("--model {}: neither a preset nor a config file (presets:{})", args.model, names);
  }
  if (args.seq > 0) job.seq_len = args.seq;
  if (args.global_batch > 0) job.global_batch = args.global_batch;
  job.model.block_size = job.seq_len;
  const std::string system = !args.system.empty()
                                 ? args.system
                                 : (args.hardware == "this-machine" ? "brigade-cpu" : "current");
  if (system == "megatron-2021") {
    job.features = sim::SystemFeatures::megatron_2021();
  } else if (system == "brigade-cpu") {
    job.features = sim::brigade_cpu_features();
  } else if (system != "current") {
    throw_error("--system must be current, megatron-2021 or brigade-cpu, got {}", system);
  }
  return job;
}

// this-machine reads its calibration, measuring (and caching) it first if
// there is none yet.
sim::Hardware hardware_from(const PlanArgs& args, int64_t devices, int64_t threads_per_device) {
  if (args.hardware != "this-machine") return sim::hardware_by_name(args.hardware);
  sim::ThisMachineNodes nodes;
  nodes.nodes = args.nodes;
  nodes.one_machine = args.one_machine;
  if (args.nodes > 1) {
    if (args.link.empty()) {
      throw_error("--nodes {} needs --link RATE (each node's link, e.g. 10gbit)", args.nodes);
    }
    nodes.link_bytes_per_s = sim::parse_link_rate(args.link);
  } else if (!args.link.empty() || args.one_machine) {
    throw_error("--link and --one-machine describe the links between nodes: add --nodes N (N > 1)");
  }
  const std::string path =
      args.calibration.empty() ? sim::default_calibration_path() : args.calibration;
  nlohmann::json calibration;
  if (std::filesystem::exists(path)) {
    try {
      calibration = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      throw_error("{}: not a calibration file ({}); rerun `brigade bench calibrate --out {}`", path,
                  e.what(), path);
    }
  } else if (!args.calibration.empty()) {
    throw_error("{}: no such calibration file; write it with `brigade bench calibrate --out {}`",
                path, path);
  } else {
    std::fprintf(stderr, "brigade plan: calibrating this machine (once; cached in %s)\n",
                 path.c_str());
    calibration = measure_this_machine();
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomic(path, calibration.dump(2) + "\n");
  }
  return sim::this_machine_hardware(calibration, devices, threads_per_device, nodes);
}

int run_validate(const PlanArgs& args) {
  const sim::ValidationSummary summary =
      sim::validate(sim::parse_published_runs(sim::builtin_published_csv()));
  if (args.json) {
    std::printf("%s\n", sim::validation_json(summary).dump(2).c_str());
  } else {
    std::printf("%s", sim::format_validation(summary).c_str());
  }
  return 0;
}

int run_plan(const PlanArgs& args) {
  if (args.model.empty()) throw_error("--model is required (a preset such as 175b, or a config)");
  sim::Workload job = workload_from(args);
  job.model.validate();
  if (args.hardware == "this-machine" && !args.sweep_gpus.empty()) {
    throw_error("--sweep-gpus plans clusters, not this-machine: use --gpus N (one per core)");
  }
  // --layout config: the run `brigade train --nproc GPUS` starts, read before
  // the hardware, whose threads per worker it sets.
  std::optional<TrainingLayout> run;
  if (args.layout == "config") {
    if (sim::find_model_preset(args.model)) {
      throw_error(
          "--layout config plans the run a training config describes, but --model {} is a "
          "preset: give the config file",
          args.model);
    }
    if (args.global_batch > 0 || args.seq > 0) {
      throw_error(
          "--layout config plans the run the config describes, but --{} would plan another "
          "one: drop it, or change the config (--set train.grad_accum=..., "
          "model.block_size=...)",
          args.global_batch > 0 ? "global-batch" : "seq");
    }
    if (args.gpus <= 0) throw_error("--gpus N is required (the number of workers to plan for)");
    run = training_layout(load_config(args.model, args.overrides), args.gpus);
    job.global_batch = run->global_batch;
    if (run->threads > 0 && args.hardware != "this-machine") {
      // A GPU's speed does not depend on the host threads that drive it.
      throw_error(
          "train.threads = {} sets a CPU worker's threads, which --hardware {} has no notion "
          "of: plan with --hardware this-machine, or drop train.threads",
          run->threads, args.hardware);
    }
  }
  // A node's devices share this machine's cores: the planner needs to know
  // how many to split them between (all of --gpus, up to one per core; on
  // --nodes N, a node's share of them).
  if ((args.nodes > 1 || !args.link.empty() || args.one_machine) &&
      args.hardware != "this-machine") {
    throw_error(
        "--nodes, --link and --one-machine describe clusters of this machine: use them with "
        "--hardware this-machine ({} has its own nodes and links)",
        args.hardware);
  }
  if (args.nodes > 1 && args.gpus <= 0) {
    throw_error("--gpus N is required (the workers to spread over --nodes {})", args.nodes);
  }
  if (args.nodes > 1 && args.gpus % args.nodes != 0) {
    throw_error("--gpus {} does not split evenly over --nodes {}: every node runs as many workers",
                args.gpus, args.nodes);
  }
  const int64_t per_node = std::max<int64_t>(args.gpus, 1) / std::max<int64_t>(args.nodes, 1);
  const sim::Hardware hw = hardware_from(args, per_node, run ? run->threads : 0);
  if (args.hardware == "this-machine") {
    const int64_t cores = hw.cores;
    if (per_node > cores) {
      throw_error("this-machine runs at most {} workers per node (one per core), --gpus is {}{}",
                  cores, args.gpus,
                  args.nodes > 1 ? fmt::format(" over {} nodes", args.nodes) : std::string());
    }
    if (run && run->threads * per_node > cores) {
      throw_error(
          "train.threads = {} on {} workers asks for {} threads but this machine has {} cores: "
          "the planner does not model threads beyond the cores; set train.threads <= {} (or 0, "
          "the cores split evenly)",
          run->threads, per_node, run->threads * per_node, cores, cores / per_node);
    }
  }
  if (!args.sweep_gpus.empty()) {
    const sim::GpuSweep sweep = sim::sweep_gpus(job, hw, sim::parse_gpu_range(args.sweep_gpus));
    std::printf("%s", args.json ? (sim::sweep_json(sweep).dump(2) + "\n").c_str()
                                : sim::format_sweep(job, hw, sweep).c_str());
    return 0;
  }
  if (args.gpus <= 0) throw_error("--gpus N is required (the number of GPUs to plan for)");

  if (!args.layout.empty()) {
    const sim::Layout layout = run ? run->layout : sim::Layout::parse(args.layout);
    if (layout.gpus() != args.gpus) {
      throw_error("--layout uses tp*pp*dp = {} GPUs but --gpus is {}", layout.gpus(), args.gpus);
    }
    const sim::Estimate e = sim::estimate(job, layout, hw);
    if (!e.valid && run) {
      // training_layout refused what training refuses: the rest is the
      // planner's own limit, not the run's.
      throw_error("--layout config: the planner cannot cost this run ({}): {}", layout.to_string(),
                  e.invalid);
    }
    if (!e.valid) throw_error("--layout {} cannot run this job: {}", args.layout, e.invalid);
    const sim::CheckpointReport ckpt = sim::checkpoint_report(job, e, hw, args.failure);
    if (args.json) {
      nlohmann::json out = sim::estimate_json(e, hw);
      out["checkpointing"] = sim::checkpoint_json(ckpt);
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("%s", sim::format_estimate(job, hw, e).c_str());
      std::printf("%s", sim::format_checkpoint_report(ckpt).c_str());
    }
    return e.fits ? 0 : 3;
  }

  const sim::SearchResult result = sim::search_layouts(job, args.gpus, hw, {}, args.top);
  if (result.ranked.empty()) {
    std::printf("%s", args.json ? (sim::search_json(result, hw).dump(2) + "\n").c_str()
                                : sim::format_search(job, hw, args.gpus, result).c_str());
    return 3;
  }
  const sim::CheckpointReport ckpt =
      sim::checkpoint_report(job, result.ranked.front(), hw, args.failure);
  if (args.json) {
    nlohmann::json out = sim::search_json(result, hw);
    out["checkpointing"] = sim::checkpoint_json(ckpt);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("%s", sim::format_search(job, hw, args.gpus, result).c_str());
    std::printf("%s", sim::format_checkpoint_report(ckpt).c_str());
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Plan a training job on a cluster: memory, step time, best layout, failure cost");
  cmd->add_option("--model", args->model, "Preset (e.g. 175b, 1t, gpt2-small) or a config file");
  cmd->add_option("--gpus", args->gpus, "Number of GPUs")->check(CLI::PositiveNumber);
  cmd->add_option("--hardware", args->hardware, "a100-80g, h100-80g, h200 or this-machine")
      ->capture_default_str();
  cmd->add_option("--global-batch", args->global_batch, "Sequences per step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seq", args->seq, "Sequence length")->check(CLI::PositiveNumber);
  cmd->add_option("--layout", args->layout,
                  "Evaluate one layout: tp=8,pp=8,dp=6,vp=1,zero=1,recompute=full,sp=false,micro=1,"
                  "schedule=1f1b (or gpipe, interleaved with vp > 1, zb-h1); or \"config\": the "
                  "layout `brigade train --nproc GPUS` runs the --model config as (its batch and "
                  "sequence too: change them with --set, not --global-batch or --seq)");
  cmd->add_option("--set", args->overrides,
                  "KEY=VALUE applied to the --model config, as `brigade train --set` does");
  cmd->add_option(
      "--system", args->system,
      "current (fused attention, overlapped dp), megatron-2021 or brigade-cpu (default on "
      "this-machine)");
  cmd->add_option("--sweep-gpus", args->sweep_gpus, "LO:HI, doubling: MFU and waiting vs scale");
  cmd->add_option("--calibration", args->calibration,
                  "this-machine's calibration file (default: measured and cached on first use)");
  cmd->add_option("--nodes", args->nodes,
                  "this-machine only: --gpus spread over this many nodes like this one (the "
                  "hierarchical backend between them)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--link", args->link,
                  "With --nodes: each node's link, in tc's units (10gbit, 800mbit)");
  cmd->add_flag("--one-machine", args->one_machine,
                "With --nodes: the nodes are network namespaces of this machine "
                "(scripts/fake_cluster.sh), sharing its cores");
  cmd->add_option("--top", args->top, "How many layouts to list")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_flag("--validate", args->validate, "Compare predictions with published measurements");
  cmd->add_option("--node-mtbf-hours", args->failure.node_mtbf_hours,
                  "Mean time between failures of one node")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--restart-s", args->failure.restart_s,
                  "Detect + restart time after a failure, before reading the checkpoint")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--storage-gb-per-s", args->failure.storage_gb_per_s,
                  "Aggregate checkpoint storage bandwidth, GB/s")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--train-tokens", args->failure.train_tokens,
                  "Tokens the job trains on (default: 20 per parameter)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--trials", args->failure.trials, "Monte Carlo trials")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->callback([args] {
    if (args->validate && (args->nodes > 1 || !args->link.empty() || args->one_machine)) {
      throw_error(
          "--validate checks published runs, whose clusters are their own: drop --nodes, "
          "--link and --one-machine");
    }
    const int rc = args->validate ? run_validate(*args) : run_plan(*args);
    if (rc != 0) {
      throw ExitStatus{rc};
    }
  });
}

}  // namespace brigade::cli

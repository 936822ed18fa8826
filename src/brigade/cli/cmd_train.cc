// brigade train CONFIG [--set section.key=value ...] [--resume PATH] [--nproc N]
//
// With --nproc N this process becomes the launcher of N workers (brigade
// launch), each running `brigade train` with parallel.dp = N / parallel.tp.
// A worker (RANK and WORLD_SIZE set by a launcher) joins the world and, on a
// dp x tp mesh (parallel/mesh.h: tp ranks consecutive), its data- and
// tensor-parallel groups over parallel.backend; rank 0 alone writes the run
// directory, the metrics and the progress line, and every rank dumps its
// flight recorder there on a communication error or on SIGUSR1.
//
// Under the launcher's elastic agent each worker beats and reports its steps
// through its heartbeat slot (elastic/heartbeat.h), and raises the faults
// elastic.inject plans for it (elastic/fault_injection.h); a crash or hang
// restarts the workers from the newest checkpoint, up to
// elastic.max_restarts times (elastic/agent.h). The workers' last step
// numbers reach the agent's /metrics endpoint the same way (diag/prometheus.h).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/cli/commands.h"
#include "brigade/cli/launcher.h"
#include "brigade/cli/load_config.h"
#include "brigade/cli/train_report.h"
#include "brigade/comm/communicator.h"
#include "brigade/comm/flight_recorder.h"
#include "brigade/comm/world.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/process_stats.h"
#include "brigade/core/threads.h"
#include "brigade/core/trace.h"
#include "brigade/diag/metrics_server.h"
#include "brigade/diag/trace.h"
#include "brigade/elastic/agent.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/snapshots.h"
#include "brigade/parallel/mesh.h"
#include "brigade/parallel/pipeline_stage.h"
#include "brigade/train/rank_stats.h"
#include "brigade/train/silent_corruption.h"
#include "brigade/train/trainer.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

// The signal (SIGINT, SIGTERM) that asked this worker to stop, or 0.
std::atomic<int> g_stop_signal{0};
void request_stop(int sig) {
  g_stop_signal = sig;
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

// diag.metrics: where the launcher's agent serves /metrics ("off": nowhere).
std::string metrics_address(Config& config) {
  std::string address = config.get_string("diag.metrics", "127.0.0.1:0");
  if (address != "off") diag::parse_metrics_address(address);  // refused before any worker starts
  return address;
}

bool launched_worker() {
  return std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr;
}

// `brigade train --nproc N`: re-runs this command as N workers under the launcher.
[[noreturn]] void launch_workers(int nproc, const std::string& config_path,
                                 const std::vector<std::string>& overrides,
                                 const std::string& resume) {
  Config config = load_config(config_path, overrides);
  // Bad shapes fail here, once, before any worker starts and allocates.
  const int tp_only = static_cast<int>(config.get_int("parallel.tp", 1));
  const int pp = static_cast<int>(config.get_int("parallel.pp", 1));
  // The model-parallel ranks of one data-parallel replica.
  const int tp = tp_only * pp;
  if (tp_only < 1 || pp < 1 || nproc % tp != 0) {
    throw_error(
        "--nproc {} is not a multiple of parallel.tp = {} times parallel.pp = {}: a dp x tp x pp "
        "mesh needs dp * tp * pp workers; use an --nproc that tp * pp divides, e.g. {}",
        nproc, tp_only, pp, tp < 1 ? 1 : tp * ((nproc + tp - 1) / tp));
  }
  {
    const GptConfig model = GptConfig::from_config(config);
    model.validate_tensor_parallel(tp_only);
    Config copy = config;
    const TrainOptions options = TrainOptions::from_config(copy);  // the schedule's checks
    if (!options.trace.empty()) diag::parse_trace_steps(options.trace, 0);
    stage_chunks(model, options.pipeline_shape(), options.parallel.stage_layers);
  }
  if (config.get_bool("parallel.sequence_parallel", false)) {
    GptConfig::from_config(config).validate_sequence_parallel(tp_only);
  }
  const int configured_dp = static_cast<int>(config.get_int("parallel.dp", nproc / tp));
  if (configured_dp != nproc / tp) {
    throw_error(
        "--nproc {} but the config sets parallel.dp = {}: the workers are dp * tp * pp = {} * {} "
        "* {}; drop parallel.dp (--nproc sets it to N / (parallel.tp * parallel.pp)), or make "
        "--nproc {}",
        nproc, configured_dp, configured_dp, tp_only, pp, configured_dp * tp);
  }
  const elastic::ElasticConfig elastic_config = elastic::ElasticConfig::from_config(config);
  LaunchOptions launch;
  launch.nproc_per_node = nproc;
  launch.max_restarts = elastic_config.max_restarts;
  launch.step_timeout_ms = static_cast<int64_t>(elastic_config.step_timeout_s * 1000);
  launch.metrics_address = metrics_address(config);
  launch.chaos = elastic::parse_chaos(elastic_config.inject);
  launch.command = {"train", config_path};
  for (const std::string& o : overrides) {
    launch.command.push_back("--set");
    launch.command.push_back(o);
  }
  launch.command.push_back("--set");
  launch.command.push_back(fmt::format("parallel.dp={}", nproc / tp));
  if (!resume.empty()) {
    launch.command.push_back("--resume");
    launch.command.push_back(resume);
  }
  throw ExitStatus{run_launch(launch)};
}

// A launched worker's process groups (all null alone). With tp 1 the world
// is the data-parallel group, as it always was; on a dp x tp mesh the
// flat buffers live in the dp group's shared memory (the zero-copy path of
// its reductions), and the world carries only saves and small agreements.
struct JoinedGroups {
  std::unique_ptr<Communicator> world, dp, tp, pp;
  TrainerGroups view() const {
    const bool mesh = tp || pp;
    return {world.get(), mesh ? dp.get() : world.get(), tp.get(), pp.get()};
  }
};

JoinedGroups join_groups(const GptConfig& model, const TrainOptions& options) {
  JoinedGroups groups;
  if (!launched_worker()) return groups;
  const WorldEnvironment world = read_world_environment();
  const int dp = options.parallel.dp, tp = options.parallel.tp, pp = options.parallel.pp;
  if (world.world_size != dp * tp * pp) {
    throw_error(
        "this job has {} workers but parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {}: "
        "start it with `brigade train --nproc {} CONFIG`, or set parallel.dp = {}",
        world.world_size, dp, tp, pp, dp * tp * pp, dp * tp * pp, world.world_size / (tp * pp));
  }
  if (world.world_size == 1) return groups;
  // Every rank's dumps go next to the run's metrics unless the user chose.
  ::setenv("BRIGADE_FLIGHT_RECORDER_DIR", options.run_dir.c_str(), 0);
  fs::create_directories(options.run_dir);
  dump_flight_recorder_on_signal(SIGUSR1, world.world_rank);
  const int64_t timeout_ms = options.parallel.timeout_s * 1000;
  const int64_t shared = shared_bytes_for_training(model);
  if (tp == 1 && pp == 1) {
    groups.world = connect_world(options.parallel.backend, timeout_ms, shared);
    return groups;
  }
  groups.world = connect_world(options.parallel.backend, timeout_ms);
  const Mesh mesh({dp, tp, pp}, world.world_size);
  const MeshCoord me = mesh.coord(world.world_rank);
  if (dp > 1) {
    groups.dp = connect_group(
        options.parallel.backend,
        pp > 1 ? fmt::format("dp{}_{}", me.pp_stage, me.tp_rank) : fmt::format("dp{}", me.tp_rank),
        mesh.group(MeshDim::kData, world.world_rank), timeout_ms, shared);
  }
  if (tp > 1) {
    groups.tp = connect_group(
        options.parallel.backend,
        pp > 1 ? fmt::format("tp{}_{}", me.pp_stage, me.dp_rank) : fmt::format("tp{}", me.dp_rank),
        mesh.group(MeshDim::kTensor, world.world_rank), timeout_ms);
  }
  if (pp > 1) {
    groups.pp =
        connect_group(options.parallel.backend, fmt::format("pp{}_{}", me.dp_rank, me.tp_rank),
                      mesh.group(MeshDim::kPipeline, world.world_rank), timeout_ms);
  }
  return groups;
}

void run_train(const std::string& config_path, const std::vector<std::string>& overrides,
               const std::string& resume, int nproc) {
  if (nproc > 0 && !launched_worker()) launch_workers(nproc, config_path, overrides, resume);
  // First, so the agent watches set-up too.
  const std::unique_ptr<elastic::WorkerHeartbeat> heartbeat =
      elastic::WorkerHeartbeat::from_environment();
  Config config = load_config(config_path, overrides);
  const GptConfig model = GptConfig::from_config(config);
  TrainOptions options = TrainOptions::from_config(config);
  const elastic::ElasticConfig elastic_config = elastic::ElasticConfig::from_config(config);
  metrics_address(config);  // the launcher's key: checked, then unused here
  config.check_all_used();
  if (!options.trace.empty()) diag::parse_trace_steps(options.trace, 0);  // refused before set-up
  const std::vector<elastic::InjectedFault> faults = elastic::parse_faults(elastic_config.inject);
  // Chaos faults come from the launcher's agent; a worker alone, or one
  // under a launcher not told of them, would silently train without any.
  const char* launcher_chaos = std::getenv("BRIGADE_CHAOS");
  if (elastic::parse_chaos(elastic_config.inject) &&
      (launcher_chaos == nullptr || std::strcmp(launcher_chaos, "1") != 0)) {
    throw_error(
        "chaos faults are raised by the launcher: add --nproc N, or pass --inject to brigade "
        "launch (elastic.inject = \"{}\")",
        elastic_config.inject);
  }
  const int world_rank = launched_worker() ? read_world_environment().world_rank : 0;
  const int64_t generation = heartbeat ? heartbeat->generation() : 0;
  if (!resume.empty()) options.resume = resume;
  // The agent that can restart this worker says where its snapshots go.
  if (const char* dir = std::getenv(elastic::kSnapshotDirVariable);
      dir != nullptr && launched_worker()) {
    options.snapshot_dir = dir;
    if (const char* parts = std::getenv(elastic::kSnapshotPartsVariable);
        parts != nullptr && std::strcmp(parts, "1") == 0) {
      // A node's workers are consecutive world ranks.
      const WorldEnvironment world = read_world_environment();
      const int first = world.world_rank - world.local_rank;
      options.snapshot_part = {first / world.local_world_size, first, world.local_world_size};
    }
  }
  const bool first_rank = !launched_worker() || read_world_environment().world_rank == 0;
  if (first_rank) check_run_dir_is_free(options);

  // Checked before connecting or allocating anything.
  model.validate_tensor_parallel(options.parallel.tp);
  if (options.parallel.sequence_parallel) model.validate_sequence_parallel(options.parallel.tp);
  stage_chunks(model, options.pipeline_shape(), options.parallel.stage_layers);
  const JoinedGroups groups = join_groups(model, options);
  if (heartbeat) heartbeat->mesh_formed();
  Communicator* const group = groups.world.get();
  // Ranks agree on when to stop, or one would wait for the others forever,
  // and on the signal that stops them (the exit status), whichever rank got
  // it: once before the first step with a collective of its own, then with
  // every step's gather of rank stats (train/rank_stats.h), the loop's one
  // collective between steps.
  auto agreed_stop_signal = [&] {
    double value = static_cast<double>(g_stop_signal.load());
    if (group) group->all_reduce(&value, 1, DType::kF64, ReduceOp::kMax)->wait();
    return static_cast<int>(value);
  };
  const int64_t slow_factor = elastic::slow_factor(faults, world_rank, generation);
  Trainer trainer(model, options, groups.view());
  for (const elastic::InjectedFault& f : faults) {
    // Every rank refuses it, so none waits for another in a collective.
    if (f.in_grad && trainer.dp_size() <= 1) {
      throw_error(
          "--inject sdc:rank={}:step={}:what=grad flips a bit of a rank's local gradient before "
          "the data-parallel reduce, and this run has no data-parallel group (one replica of "
          "the model): there is no reduce to corrupt and no replay to catch it; run it with "
          "more data-parallel ranks (--nproc) or leave what=grad out",
          f.rank, f.step);
    }
  }
  for (const elastic::InjectedFault& f : elastic::in_step_faults(faults, world_rank, generation)) {
    if (f.kind == elastic::InjectedFault::Kind::kNan) {
      trainer.poison_loss(f.step - 1, static_cast<int>(f.times));
    } else if (f.in_grad) {
      trainer.flip_gradient_before_reduce(f.step - 1);
    } else {
      trainer.flip_bit_before_forward(f.step - 1);
    }
  }
  SilentCorruptionGuard sdc_guard(trainer, group);
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  // Rank 0 reports; every rank trains, evaluates and saves (under ZeRO these
  // are collective), at the same steps.
  std::optional<RunReport> report;
  if (first_rank) report.emplace(config, model, options, trainer);
  if (heartbeat && report) heartbeat->machine_peak(report->rank_peak_gflops());
  // After the report's set-up (it measures the peak FLOP/s), so that the
  // first step's time in the recovery split is the step's own.
  if (heartbeat) heartbeat->started(trainer.step(), options.run_dir);
  auto note = [&](const std::string& message) {
    if (report) report->note(message);
  };
  auto evaluate = [&](int64_t step) {
    const double val_loss = trainer.evaluate();
    if (report) report->validation(step, val_loss);
  };
  auto save = [&] {
    const fs::path saved = trainer.save_checkpoint();
    note("saved " + saved.string());
  };
  int stop_signal = 0;
  int64_t previous_end_ns = 0;
  // Each step's window on the clock runs from the previous step's gather to
  // this one's: the gather, the report, the saves started and evaluations
  // after a step are the next step's (train/step_breakdown.h).
  StepClock& clock = trainer.step_clock();
  RankStats rank_stats(group, node_from_environment(), trainer.pp_stage(), clock.counts_runqueue());
  for (const std::string& line : rank_stats.notes()) note(line);
  std::optional<diag::TraceWindow> trace_window;
  if (!options.trace.empty()) {
    const diag::TraceSteps steps = diag::parse_trace_steps(options.trace, trainer.step());
    if (steps.last <= trainer.step() || steps.first > options.steps) {
      note(fmt::format("diag.trace: steps {}-{} are outside this run's steps {}-{}: no trace",
                       steps.first, steps.last, trainer.step() + 1, options.steps));
    } else {
      // A restarted generation traces its own window into its own file.
      trace_window.emplace(steps, options.run_dir, diag::trace_file_name(generation), group,
                           world_rank, fmt::format("node {}", node_from_environment()));
    }
  }
  auto trace_written = [&, said = false]() mutable {
    if (!said && trace_window && !trace_window->written().empty()) {
      said = true;
      note(fmt::format("wrote {} (open it in https://ui.perfetto.dev)",
                       trace_window->written().string()));
    }
  };
  clock.restart();
  try {
    if (trainer.step() < options.steps) {
      const StepClock::Section comm(clock, StepPart::kComm);
      stop_signal = agreed_stop_signal();
    }
    while (trainer.step() < options.steps && stop_signal == 0) {
      if (trace_window) trace_window->before_step(trainer.step() + 1);
      const StepMetrics m = trainer.train_step();
      if (slow_factor > 1) {
        // An injected straggler: its compute takes factor times as long.
        const StepClock::Section compute(clock, StepPart::kCompute);
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(
            m.compute_ms * static_cast<double>(slow_factor - 1)));
      }
      const StepBreakdown breakdown = clock.end_step();
      // An injected skip or mismatch (elastic/fault_injection.h) acts on the
      // collective right after the step, this gather: left out, or called
      // with one number more.
      const elastic::InjectedFault* fault =
          elastic::fault_after_step(faults, world_rank, generation, trainer.step());
      GatherFault gather_fault = GatherFault::kNone;
      if (fault != nullptr && fault->kind == elastic::InjectedFault::Kind::kSkip) {
        gather_fault = GatherFault::kSkip;
      }
      if (fault != nullptr && fault->kind == elastic::InjectedFault::Kind::kMismatch) {
        gather_fault = GatherFault::kMismatch;
      }
      if (gather_fault != GatherFault::kNone) elastic::raise_fault(*fault, heartbeat.get());
      // Every rank's breakdown and peak RSS, for rank 0's metrics (ZeRO's
      // saving shows per rank), every stage's bubble (one rank per stage is
      // reported), the straggler check, the saves' states and the stop
      // signals: the one collective between this step and the next (a save
      // started once the previous one settled adds none).
      const RankStepStats ranks = [&] {
        const StepClock::Section comm(clock, StepPart::kComm);
        return rank_stats.gather(trainer.step(), breakdown, static_cast<double>(peak_rss_bytes()),
                                 m.bubble_ms, trainer.save_states(), g_stop_signal.load(),
                                 gather_fault);
      }();
      // Every rank stops after this step, with one final checkpoint, if any
      // rank was sent a signal; after the last step the run ends as it
      // would have anyway (its final save and evaluation, exit status 0).
      if (trainer.step() < options.steps) stop_signal = ranks.stop_signal;
      for (const StragglerEvent& e : ranks.stragglers) {
        if (e.started && report) trace::instant("alarm", "straggler named: rank", e.rank);
      }
      std::optional<AsyncCheckpointWriter::Stats> checkpoint, snapshot;
      {
        // From the states gathered with the ranks' stats: a save in flight
        // completes, or fails, on every rank at once, with no collective of
        // its own.
        const StepClock::Section stall(clock, StepPart::kCheckpoint);
        checkpoint = trainer.poll_checkpoint(ranks.checkpoint_states);
        snapshot = trainer.poll_snapshot(ranks.snapshot_states);
      }
      const int64_t end_ns = now_ns();
      const double loop_ms = previous_end_ns > 0 ? (end_ns - previous_end_ns) / 1e6 : 0.0;
      previous_end_ns = end_ns;
      elastic::StepStats stats;
      stats.loss = m.loss;
      stats.tokens_per_s = m.tokens_per_s;
      stats.comm_wait_fraction = breakdown[StepPart::kComm] / breakdown.step_ms;
      stats.part_ms = breakdown.ms;
      if (report) {
        stats.mfu = report->step(m, trainer.bucket_timings(), ranks, checkpoint, snapshot, loop_ms,
                                 stage_bubbles(ranks.bubble_ms, trainer));
      }
      const int64_t done = trainer.step();
      if (heartbeat) {
        heartbeat->step_stats(stats);
        // Training time in the ETTR (elastic/incidents.h): the step's whole
        // window on the loop's clock, the loop's own work between steps
        // included, less what it spent on saves and evaluations.
        const double training_ms =
            breakdown.step_ms - breakdown[StepPart::kCheckpoint] - breakdown[StepPart::kEval];
        heartbeat->step_done(done, static_cast<int64_t>(m.step_ms * 1e6),
                             static_cast<int64_t>(std::max(0.0, training_ms) * 1e6));
      }
      // After the step and the previous save's commit, before the next save.
      if (fault != nullptr && gather_fault == GatherFault::kNone) {
        elastic::raise_fault(*fault, heartbeat.get());
        if (fault->kind == elastic::InjectedFault::Kind::kSdc) {
          std::fprintf(stderr, "brigade train: flipped a bit of %s\n",
                       trainer.flip_parameter_bit(fault->in_moment).c_str());
        }
      }
      // Copied now, written while the next step runs. The replicas compare
      // what a save holds in the next step, before its update and before
      // the save can commit (train/silent_corruption.h).
      // After a stop the ranks agreed on, the final save below is the only
      // one: a snapshot, background checkpoint or evaluation started now
      // would delay the exit for a state the final checkpoint holds anyway.
      const bool going_on = done < options.steps && stop_signal == 0;
      if (trainer.snapshots_enabled() && done % options.snapshot_every == 0 && going_on) {
        const StepClock::Section stall(clock, StepPart::kCheckpoint);
        trainer.start_snapshot();
      }
      if (options.checkpoint_every > 0 && done % options.checkpoint_every == 0 && going_on) {
        // Training goes on while it is written; the next save waits for it.
        const StepClock::Section stall(clock, StepPart::kCheckpoint);
        const fs::path saving = trainer.start_checkpoint();
        note("saving " + saving.string() + " in the background");
      }
      if (options.eval_every > 0 && done % options.eval_every == 0 && going_on &&
          trainer.dataset() != nullptr) {
        const StepClock::Section eval(clock, StepPart::kEval);
        evaluate(done);
      }
      if (trace_window) {
        trace_window->after_step(done);
        if (done == trace_window->steps().last) trace_written();
      }
    }
    if (trace_window) {
      // Also after a stop every rank agreed on: still collective.
      trace_window->finish();
      trace_written();
    }
    if (stop_signal != 0) {
      note(fmt::format("interrupted at step {}; saving a checkpoint", trainer.step()));
      // Every rank agreed to stop, so all of them compare.
      sdc_guard.before_save();
      save();
      std::fflush(nullptr);
      throw ExitStatus{128 + stop_signal};
    }
    // Save before the final evaluation: the trained state is what matters.
    sdc_guard.before_save();
    save();
    if (trainer.dataset() != nullptr) evaluate(trainer.step());
  } catch (const CommError& e) {
    trace::stop();  // a broken group writes no trace
    // A stop signal is answered with the signal's exit status. If the group
    // broke on the way (a peer had died: the launcher signals the survivors
    // then), no collective save can happen: give it up at once, well inside
    // the launcher's grace period, and keep the newest complete checkpoint.
    const int sig = g_stop_signal.load();
    if (sig == 0) throw;
    trainer.abandon_checkpoint();
    std::fprintf(stderr,
                 "brigade train: stopping on %s at step %lld without saving: the group is broken "
                 "(%s); the newest complete checkpoint stays as it was\n",
                 strsignal(sig), static_cast<long long>(trainer.step()), e.what());
    std::fflush(nullptr);
    throw ExitStatus{128 + sig};
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto resume = std::make_shared<std::string>();
  auto nproc = std::make_shared<int>(0);
  auto inject = std::make_shared<std::string>();
  auto max_restarts = std::make_shared<int>(-1);
  auto metrics = std::make_shared<std::string>();
  auto trace = std::make_shared<std::string>();
  cmd->add_option("config", *config_path, "Config file (see examples/)")->required();
  cmd->add_option("--set", *overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--resume", *resume, "Continue from a run or checkpoint directory");
  cmd->add_option("--nproc", *nproc,
                  "Worker processes on this machine: dp * tp of them (sets parallel.dp to "
                  "N / parallel.tp)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-restarts", *max_restarts,
                  "With --nproc: after a worker crashes or hangs, restart the workers from the "
                  "newest checkpoint up to N times (sets elastic.max_restarts, default 3)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option(
      "--inject", *inject,
      "Faults to raise, for tests: kill:rank=R:step=S[:gen=G], stop:..., skip:..., "
      "mismatch:..., sdc:...[:when=forward][:what=moment|grad], nan:rank=R:step=S[:times=N] or "
      "slow:rank=R:factor=F, and with --nproc random ones, "
      "chaos:mtbf=SECONDS[:kinds=kill+stop][:seed=N]; comma separated (sets "
      "elastic.inject)");
  cmd->add_option("--metrics", *metrics,
                  "With --nproc: where the launcher serves /metrics for Prometheus, HOST:PORT "
                  "(port 0 picks a free one and prints it) or off (sets diag.metrics, default "
                  "127.0.0.1:0)");
  cmd->add_option("--trace", *trace,
                  "Write RUN_DIR/trace.json (Chrome trace format: Perfetto, chrome://tracing) of "
                  "steps A:B, or of the first N steps: every rank on one timeline (sets "
                  "diag.trace)");
  cmd->callback([=] {
    std::vector<std::string> all = *overrides;
    if (!trace->empty()) all.push_back(fmt::format("diag.trace=\"{}\"", *trace));
    if (!metrics->empty()) all.push_back(fmt::format("diag.metrics=\"{}\"", *metrics));
    if (*max_restarts >= 0) all.push_back(fmt::format("elastic.max_restarts={}", *max_restarts));
    if (!inject->empty()) all.push_back(fmt::format("elastic.inject=\"{}\"", *inject));
    run_train(*config_path, all, *resume, *nproc);
  });
}

}  // namespace brigade::cli

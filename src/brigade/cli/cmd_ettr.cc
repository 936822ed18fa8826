// brigade ettr RUN_DIR [--mtbf-s S] [--restart-s S] [--json]: a run's
// measured ETTR against the planner's failure model (sim/failure_model.h)
// for the same MTBF, snapshot interval and restart cost.
//
// From the run directory: the agent's summary and incidents
// (incidents.jsonl: kept training time, the training window, each
// recovery's time), the step records (metrics.jsonl, rank 0's breakdown:
// a step's time on the loop's clock less its saves and evaluations, and
// those), and the snapshot interval
// (config.toml's train.snapshot_every, its default where the file does not
// set it, else its checkpoint_every when it turns snapshots off). The MTBF
// is the chaos mode's (elastic/fault_injection.h) unless --mtbf-s says; the
// restart cost is the mean of the run's recoveries, fault to the first step
// after it, less one step (that step is training), unless --restart-s says.
// The measured ETTR the model speaks of is kept training time over the
// training window (first step to last); the run's own, over the launcher's
// whole wall time, is shown beside it.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/sim/failure_model.h"
#include "brigade/train/train_options.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

std::vector<nlohmann::json> read_lines(const fs::path& path, const char* made_by) {
  std::ifstream in(path);
  if (!in) throw_error("{} is missing: {}", path.string(), made_by);
  std::vector<nlohmann::json> lines;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty()) continue;
    try {
      lines.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      throw_error("{} line {} is not JSON: {}", path.string(), number, e.what());
    }
  }
  return lines;
}

double number_at(const nlohmann::json& j, const char* key, const fs::path& file) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    throw_error("{}: a record has no number '{}': {}", file.string(), key, j.dump());
  }
  return it->get<double>();
}

struct Comparison {
  sim::MeasuredRun run;
  std::string mtbf_from;
  int recoveries = 0;
  double measured_ettr = 0;  // over the training window
  double wall_ettr = 0;      // the run's own, over the whole wall time
  double training_s = 0;
  double wall_s = 0;
  int incidents = 0;
  double predicted_ettr = 0;
};

Comparison compare(const fs::path& run_dir, std::optional<double> mtbf_s,
                   std::optional<double> restart_s) {
  const fs::path incidents_path = run_dir / "incidents.jsonl";
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  const char* agent = "it is written by `brigade train --nproc N` (its agent) at the end of a run";
  // A run directory launched again (--resume) holds each launch's records,
  // each launch's ended by its summary: the last launch's are those after
  // the summary before its own.
  std::optional<nlohmann::json> summary;
  std::vector<double> recoveries_s, launch_recoveries_s;
  for (const nlohmann::json& j : read_lines(incidents_path, agent)) {
    if (j.value("kind", "") == "summary") {
      summary = j;
      recoveries_s = std::move(launch_recoveries_s);
      launch_recoveries_s.clear();
    } else if (j.value("restart", true) && j.contains("recovered_after_ms") &&
               j["recovered_after_ms"].is_number()) {
      // A record with restart false (a rejoin, a straggler) is no failure:
      // its pause is in the measured ETTR, not in the restart cost.
      launch_recoveries_s.push_back((number_at(j, "detected_after_ms", incidents_path) +
                                     number_at(j, "recovered_after_ms", incidents_path)) *
                                    1e-3);
    }
  }
  if (!summary) {
    throw_error("{} has no summary: the run has not ended (or its agent was killed)",
                incidents_path.string());
  }
  Comparison c;
  const std::vector<nlohmann::json> metrics =
      read_lines(metrics_path, "it is written by `brigade train`");
  // The summary is metrics.jsonl's record too: the last launch's steps are
  // those between the last two, and steps after the last are a launch that
  // has not ended.
  size_t from = 0, to = metrics.size();
  for (size_t n = 0; n < metrics.size(); ++n) {
    if (metrics[n].value("kind", "") != "summary") continue;
    if (to != metrics.size()) from = to + 1;
    to = n;
  }
  if (to == metrics.size()) {
    throw_error("{} has no summary record: the run has not ended (or its agent was killed)",
                metrics_path.string());
  }
  for (size_t n = to + 1; n < metrics.size(); ++n) {
    if (metrics[n].contains("loss")) {
      throw_error(
          "{} has step records after the last summary: the run directory was launched again "
          "and that launch has not ended (or its agent was killed); run brigade ettr once it "
          "ends",
          metrics_path.string());
    }
  }
  // The run counts a step's training time as the workers do
  // (elastic/incidents.h, productive time): its breakdown's window less
  // its saves and evaluations, which are the model's checkpoint cost.
  double training_ms = 0, overhead_ms = 0;
  int steps = 0;
  for (size_t n = from; n < to; ++n) {
    const nlohmann::json& j = metrics[n];
    if (!j.contains("loss")) continue;
    const auto breakdown = j.find("breakdown");
    if (breakdown == j.end() || !breakdown->is_object()) {
      throw_error("{}: a step record has no breakdown (a brigade before it wrote one?): {}",
                  metrics_path.string(), j.dump());
    }
    const double saves = number_at(*breakdown, "ckpt_ms", metrics_path) +
                         number_at(*breakdown, "eval_ms", metrics_path);
    training_ms += std::max(0.0, number_at(*breakdown, "step_ms", metrics_path) - saves);
    overhead_ms += saves;
    ++steps;
  }
  if (steps == 0) throw_error("{} has no step records", metrics_path.string());
  c.run.step_s = training_ms * 1e-3 / steps;
  c.run.overhead_s = overhead_ms * 1e-3 / steps;

  Config config = Config::from_file(run_dir / "config.toml");
  c.run.snapshot_every = config.get_int("train.snapshot_every", TrainOptions{}.snapshot_every);
  if (c.run.snapshot_every < 1) c.run.snapshot_every = config.get_int("train.checkpoint_every", 0);
  if (c.run.snapshot_every < 1) {
    throw_error(
        "{} has neither train.snapshot_every nor train.checkpoint_every: a run that keeps no "
        "state until its end is outside the model (it checkpoints at intervals)",
        (run_dir / "config.toml").string());
  }

  c.incidents = static_cast<int>(number_at(*summary, "incidents", incidents_path));
  c.wall_s = number_at(*summary, "wall_s", incidents_path);
  c.wall_ettr = number_at(*summary, "ettr", incidents_path);
  c.training_s = summary->value("training_s", 0.0);
  c.run.work_s = number_at(*summary, "productive_s", incidents_path);
  if (!(c.training_s > 0) || !(c.run.work_s > 0)) {
    throw_error("{}'s summary has no training window or no kept training time: {}",
                incidents_path.string(), summary->dump());
  }
  c.measured_ettr = std::min(1.0, c.run.work_s / c.training_s);
  if (mtbf_s) {
    c.run.mtbf_s = *mtbf_s;
    c.mtbf_from = "--mtbf-s";
  } else if (summary->contains("chaos_mtbf_s")) {
    c.run.mtbf_s = number_at(*summary, "chaos_mtbf_s", incidents_path);
    c.mtbf_from = "the run's chaos mode";
  } else {
    throw_error(
        "the run had no chaos mode, so its MTBF is not known: pass --mtbf-s (it had {} "
        "incident(s) in {:.1f} s of training)",
        c.incidents, c.training_s);
  }
  c.recoveries = static_cast<int>(recoveries_s.size());
  if (restart_s) {
    c.run.restart_s = *restart_s;
  } else if (!recoveries_s.empty()) {
    double sum = 0;
    for (double r : recoveries_s) sum += r;
    c.run.restart_s = std::max(0.0, sum / c.recoveries - c.run.step_s);
  } else {
    throw_error(
        "the run recovered from no fault, so its restart cost is not known: pass "
        "--restart-s");
  }
  c.predicted_ettr = sim::predicted_run_ettr(c.run);
  return c;
}

}  // namespace

void add_ettr_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto mtbf_s = std::make_shared<double>(0);
  auto restart_s = std::make_shared<double>(-1);
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "ettr",
      "Compare a run's measured ETTR with the planner's failure model for the same MTBF, "
      "snapshot interval and restart cost");
  cmd->add_option("run_dir", *run_dir, "The run directory (train.run_dir)")->required();
  cmd->add_option("--mtbf-s", *mtbf_s,
                  "The mean seconds between faults (default: the run's chaos mode's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--restart-s", *restart_s,
                  "Seconds from a fault to training again (default: the run's recoveries)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", *json, "One JSON object on stdout instead of text");
  cmd->callback([run_dir, mtbf_s, restart_s, json] {
    const Comparison c =
        compare(*run_dir, *mtbf_s > 0 ? std::optional<double>(*mtbf_s) : std::nullopt,
                *restart_s >= 0 ? std::optional<double>(*restart_s) : std::nullopt);
    if (*json) {
      const nlohmann::json out = {{"measured_ettr", c.measured_ettr},
                                  {"predicted_ettr", c.predicted_ettr},
                                  {"wall_ettr", c.wall_ettr},
                                  {"training_s", c.training_s},
                                  {"wall_s", c.wall_s},
                                  {"incidents", c.incidents},
                                  {"mtbf_s", c.run.mtbf_s},
                                  {"step_s", c.run.step_s},
                                  {"overhead_s", c.run.overhead_s},
                                  {"snapshot_every", c.run.snapshot_every},
                                  {"restart_s", c.run.restart_s},
                                  {"work_s", c.run.work_s}};
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    std::printf(
        "measured ETTR %.1f%% (%.1f s kept of %.1f s of training; %.1f%% of the %.1f s wall time "
        "with start-up and end), %d incident%s\n"
        "model ETTR    %.1f%% (MTBF %.1f s from %s; a snapshot every %lld step%s of %.3f s, "
        "%.3f s of saves and evaluations a step; restart %.2f s%s)\n"
        "difference    %+.1f ETTR points\n",
        100 * c.measured_ettr, c.run.work_s, c.training_s, 100 * c.wall_ettr, c.wall_s, c.incidents,
        c.incidents == 1 ? "" : "s", 100 * c.predicted_ettr, c.run.mtbf_s, c.mtbf_from.c_str(),
        static_cast<long long>(c.run.snapshot_every), c.run.snapshot_every == 1 ? "" : "s",
        c.run.step_s, c.run.overhead_s, c.run.restart_s,
        *restart_s >= 0 ? " from --restart-s"
                        : fmt::format(", the mean of {} recover{}", c.recoveries,
                                      c.recoveries == 1 ? "y" : "ies")
                              .c_str(),
        100 * (c.measured_ettr - c.predicted_ettr));
  });
}

}  // namespace brigade::cli

#include "brigade/elastic/incidents.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade::elastic {

std::optional<double> Incident::recovered_after_ms() const {
  if (!recovered_ns) return std::nullopt;
  return (*recovered_ns - detected_ns) * 1e-6;
}

std::optional<int64_t> Incident::steps_lost() const {
  if (!resumed_from_step) return std::nullopt;
  return std::max<int64_t>(0, last_step - *resumed_from_step);
}

Incident::RecoverySplit Incident::recovery_split() const {
  auto phase = [](int64_t from, int64_t to) -> std::optional<double> {
    if (from <= 0 || to <= 0 || to < from) return std::nullopt;
    return (to - from) * 1e-6;
  };
  RecoverySplit s;
  s.detect = phase(fault_ns, detected_ns);
  s.stop = phase(detected_ns, stopped_ns);
  s.rendezvous = phase(stopped_ns, mesh_ns);
  s.load = phase(mesh_ns, ready_ns);
  s.first_step = phase(ready_ns, recovered_ns.value_or(0));
  return s;
}

std::string Incident::recovery_line() const {
  const RecoverySplit s = recovery_split();
  auto ms = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.0f} ms", *v) : std::string("?");
  };
  return fmt::format("detect {}, stop {}, rendezvous {}, load {}, first step {}", ms(s.detect),
                     ms(s.stop), ms(s.rendezvous), ms(s.load), ms(s.first_step));
}

nlohmann::json Incident::to_json() const {
  nlohmann::json j = {{"kind", kind},
                      {"rank", rank},
                      {"node", node},
                      {"pid", pid},
                      {"generation", generation},
                      {"what", what},
                      {"injected", injected},
                      {"detected_after_ms", detected_after_ms()},
                      {"last_step", last_step}};
  j["signal"] = signal ? nlohmann::json(*signal) : nlohmann::json(nullptr);
  j["exit_code"] = exit_code ? nlohmann::json(*exit_code) : nlohmann::json(nullptr);
  // The job went on with fewer nodes after it.
  if (nodes > 0) j["nodes"] = nodes;
  // A rejoin (the job grew back) stopped the job but is no failure and
  // used no restart: not one of the failures `brigade ettr`, report and
  // the model count, as a straggler's record is not.
  if (!failure()) j["restart"] = false;
  const auto recovered = recovered_after_ms();
  j["recovered_after_ms"] = recovered ? nlohmann::json(*recovered) : nlohmann::json(nullptr);
  j["resumed_from_step"] =
      resumed_from_step ? nlohmann::json(*resumed_from_step) : nlohmann::json(nullptr);
  const auto lost = steps_lost();
  j["steps_lost"] = lost ? nlohmann::json(*lost) : nlohmann::json(nullptr);
  j["cause"] = cause.empty() ? nlohmann::json(nullptr) : nlohmann::json(cause);
  j["evidence_ms"] = evidence_ms;
  // On the wall clock, for the run's trace (diag/trace_incidents.h): this
  // agent's monotonic stamps (another node's detection is placed on this
  // clock too) through the two clocks' offset read now. The trace's zero is
  // rank 0's, converted on rank 0's machine: wall clock against wall clock.
  const auto unix_us = [](int64_t ns) {
    return ns > 0 ? nlohmann::json(steady_to_unix_us(ns)) : nlohmann::json(nullptr);
  };
  j["fault_unix_us"] = unix_us(fault_ns);
  j["detected_unix_us"] = unix_us(detected_ns);
  j["recovered_unix_us"] = unix_us(recovered_ns.value_or(0));
  const RecoverySplit split = recovery_split();
  auto value = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  j["recovery_ms"] = {{"detect", value(split.detect)},
                      {"stop", value(split.stop)},
                      {"rendezvous", value(split.rendezvous)},
                      {"load", value(split.load)},
                      {"first_step", value(split.first_step)}};
  return j;
}

std::filesystem::path incident_dir(const std::filesystem::path& run_dir, int64_t number) {
  return run_dir / "incidents" / std::to_string(number);
}

nlohmann::json RunSummary::to_json() const {
  return {{"kind", "summary"},    {"incidents", incidents}, {"rejoins", rejoins},
          {"restarts", restarts}, {"wall_s", wall_s},       {"productive_s", productive_s},
          {"lost_s", lost_s},     {"ettr", ettr},           {"training_s", training_s}};
}

std::string RunSummary::line() const {
  const std::string grew =
      rejoins > 0 ? fmt::format(", {} rejoin{}", rejoins, rejoins == 1 ? "" : "s") : "";
  return fmt::format(
      "{} incident{}{}, {} restart{}, {:.1f} s lost; ETTR {:.1f}% ({:.1f} s in kept steps of "
      "{:.1f} s)",
      incidents, incidents == 1 ? "" : "s", grew, restarts, restarts == 1 ? "" : "s", lost_s,
      100.0 * ettr, productive_s, wall_s);
}

void note_resumed_from(std::vector<Incident>& incidents, int64_t generation, int64_t start_step) {
  if (start_step < 0) return;
  for (Incident& i : incidents) {
    if (i.generation + 1 == generation && !i.resumed_from_step) i.resumed_from_step = start_step;
  }
}

void JobProgress::saw(int64_t last_step) {
  highest_step = std::max(highest_step, last_step);
}

void JobProgress::account(Incident& incident) {
  saw(incident.last_step);
  incident.last_step = highest_step;
  if (incident.mean_step_ms > 0) mean_step_ms = incident.mean_step_ms;
  incident.mean_step_ms = mean_step_ms;
}

RunSummary summarize(const std::vector<Incident>& incidents,
                     const std::vector<GenerationRecord>& generations, int restarts,
                     int64_t start_ns, int64_t end_ns) {
  RunSummary s;
  for (const Incident& i : incidents) ++(i.failure() ? s.incidents : s.rejoins);
  s.restarts = restarts;
  s.wall_s = std::max<int64_t>(0, end_ns - start_ns) * 1e-9;
  for (size_t g = 0; g < generations.size(); ++g) {
    const GenerationRecord& gen = generations[g];
    const int64_t steps = gen.last_step - gen.start_step;
    if (gen.start_step < 0 || steps <= 0) continue;
    // The next generation that trained says where the kept history ends.
    int64_t kept_until = gen.last_step;
    for (size_t later = g + 1; later < generations.size(); ++later) {
      if (generations[later].start_step >= 0) {
        kept_until = std::clamp(generations[later].start_step, gen.start_step, gen.last_step);
        break;
      }
    }
    s.productive_s += gen.train_ns * 1e-9 * static_cast<double>(kept_until - gen.start_step) /
                      static_cast<double>(steps);
  }
  int64_t training_from = 0, training_to = 0;
  for (const GenerationRecord& gen : generations) {
    if (training_from == 0 && gen.ready_ns > 0) training_from = gen.ready_ns;
    training_to = std::max(training_to, gen.step_end_ns);
  }
  if (training_from > 0 && training_to > training_from) {
    s.training_s = (training_to - training_from) * 1e-9;
  }
  for (size_t n = 0; n < incidents.size(); ++n) {
    const Incident& i = incidents[n];
    // Not recovered: lost until the next fault overtook the recovery, or the end.
    const int64_t overtaken = n + 1 < incidents.size() ? incidents[n + 1].fault_ns : end_ns;
    const int64_t until = i.recovered_ns.value_or(overtaken);
    s.lost_s += std::max<int64_t>(0, until - i.fault_ns) * 1e-9;
    s.lost_s += static_cast<double>(i.steps_lost().value_or(0)) * i.mean_step_ms * 1e-3;
  }
  s.ettr = s.wall_s > 0 ? std::min(1.0, s.productive_s / s.wall_s) : 0.0;
  return s;
}

void append_json_line(const std::filesystem::path& path, const nlohmann::json& line) {
  AppendFile(path).append_line(line.dump());
}

}  // namespace brigade::elastic

#include "brigade/diag/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace brigade::diag {
namespace {

class Writer {
 public:
  explicit Writer(int node) : node_(node) {}

  void family(const char* name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void node_value(const char* name, double value) {
    out_ += fmt::format("{}{{node=\"{}\"}} {}\n", name, node_, number(value));
  }
  void rank_value(const char* name, int rank, double value) {
    out_ += fmt::format("{}{{node=\"{}\",rank=\"{}\"}} {}\n", name, node_, rank, number(value));
  }
  void part_value(const char* name, int rank, const char* part, double value) {
    out_ += fmt::format("{}{{node=\"{}\",rank=\"{}\",part=\"{}\"}} {}\n", name, node_, rank, part,
                        number(value));
  }
  std::string take() { return std::move(out_); }

 private:
  // Prometheus reads Go's float syntax; fmt's shortest round-trip form is one.
  static std::string number(double v) {
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    return fmt::format("{}", v);
  }
  int node_;
  std::string out_;
};

}  // namespace

std::string prometheus_text(const elastic::AgentStatus& s) {
  Writer w(s.node_rank);
  using Worker = elastic::AgentStatus::Worker;
  const std::vector<Worker>& workers = s.workers;
  // The first worker (by local rank) that has reported a value.
  auto first_known = [&](auto get) -> std::optional<double> {
    for (const Worker& k : workers) {
      const double v = get(k.progress.stats);
      if (!std::isnan(v)) return v;
    }
    return std::nullopt;
  };

  w.family("brigade_generation", "gauge",
           "The generation of workers now running (0, then one more per restart).");
  w.node_value("brigade_generation", static_cast<double>(s.generation));
  w.family("brigade_restarts_total", "counter", "Restarts of this node's workers after a failure.");
  w.node_value("brigade_restarts_total", s.restarts);
  w.family("brigade_incidents_total", "counter",
           "Failures (crash, hang) the agent detected, as in RUN_DIR/incidents.jsonl.");
  w.node_value("brigade_incidents_total", s.incidents);

  if (!workers.empty()) {
    int64_t step = workers.front().progress.step;
    for (const Worker& k : workers) step = std::min(step, k.progress.step);
    w.family("brigade_step", "gauge",
             "Training steps completed by every worker of this node (the fewest among them).");
    w.node_value("brigade_step", static_cast<double>(step));
  }
  const struct {
    const char* name;
    const char* help;
    double elastic::StepStats::*field;
  } job_values[] = {
      {"brigade_loss", "The last step's mean training loss over the global batch.",
       &elastic::StepStats::loss},
      {"brigade_tokens_per_second", "Tokens of the global batch over the last step's time.",
       &elastic::StepStats::tokens_per_s},
      {"brigade_mfu",
       "Model FLOPs utilisation of the last step (0..1), against the machines' measured peak.",
       &elastic::StepStats::mfu},
  };
  for (const auto& v : job_values) {
    const auto value = first_known([&](const elastic::StepStats& st) { return st.*v.field; });
    if (!value) continue;
    w.family(v.name, "gauge", v.help);
    w.node_value(v.name, *value);
  }

  if (workers.empty()) return w.take();
  w.family("brigade_worker_up", "gauge", "1 while the worker process runs, else 0.");
  for (const Worker& k : workers) w.rank_value("brigade_worker_up", k.rank, k.running ? 1 : 0);
  w.family("brigade_heartbeat_age_seconds", "gauge",
           "Seconds since the worker's last heartbeat (the agent calls it hung after 2).");
  for (const Worker& k : workers) {
    if (k.progress.beat_ns == 0) continue;
    w.rank_value("brigade_heartbeat_age_seconds", k.rank,
                 static_cast<double>(std::max<int64_t>(0, s.taken_ns - k.progress.beat_ns)) / 1e9);
  }
  w.family("brigade_step_seconds", "gauge", "The worker's last training step, in seconds.");
  for (const Worker& k : workers) {
    if (k.progress.last_step_ns > 0) {
      w.rank_value("brigade_step_seconds", k.rank,
                   static_cast<double>(k.progress.last_step_ns) / 1e9);
    }
  }
  w.family("brigade_comm_wait_fraction", "gauge",
           "Share of the worker's last step spent waiting on communication that overlap did not "
           "hide.");
  for (const Worker& k : workers) {
    if (!std::isnan(k.progress.stats.comm_wait_fraction)) {
      w.rank_value("brigade_comm_wait_fraction", k.rank, k.progress.stats.comm_wait_fraction);
    }
  }
  w.family("brigade_step_part_seconds", "gauge",
           "The worker's last step, in seconds, by part: compute, optimizer, comm, bubble, data, "
           "ckpt, eval, other (they add up to the loop's window for the step).");
  for (const Worker& k : workers) {
    for (int i = 0; i < kStepParts; ++i) {
      const double ms = k.progress.stats.part_ms[static_cast<size_t>(i)];
      if (!std::isnan(ms)) {
        w.part_value("brigade_step_part_seconds", k.rank, step_part_name(static_cast<StepPart>(i)),
                     ms / 1e3);
      }
    }
  }
  return w.take();
}

}  // namespace brigade::diag

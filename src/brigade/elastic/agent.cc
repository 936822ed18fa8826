// The agent's supervision loop, its incidents and its run records (the
// coordinator's side is agent_nodes.cc, the chaos it raises itself
// agent_chaos.cc).
#include "brigade/elastic/agent.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <tuple>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/core/clock.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incident_evidence.h"
#include "brigade/elastic/snapshot_sync.h"

namespace brigade::elastic {
namespace fs = std::filesystem;
namespace {

std::string plural(int n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// Workers that ended since the agent last looked, the likeliest cause of the
// failure first: one that raised an injected fault, then one killed by a
// signal, then by rank. A loaded machine can let a peer notice the death and
// exit with an error before the agent wakes, and the exits carry no times.
std::vector<WorkerExit> by_likely_cause(std::vector<WorkerExit> exits,
                                        const HeartbeatTable& table) {
  auto rank_of = [&](const WorkerExit& e) {
    const bool injected = table.read(e.worker.local_rank).fault_ns > 0;
    return std::make_tuple(!injected, !WIFSIGNALED(e.wait_status), e.worker.rank);
  };
  std::stable_sort(exits.begin(), exits.end(), [&](const WorkerExit& a, const WorkerExit& b) {
    return rank_of(a) < rank_of(b);
  });
  return exits;
}

}  // namespace

ElasticConfig ElasticConfig::from_config(Config& config) {
  ElasticConfig e;
  const int64_t restarts = config.get_int("elastic.max_restarts", e.max_restarts);
  if (restarts < 0 || restarts > 1000) {
    throw_error("elastic.max_restarts must be in 0..1000, got {}", restarts);
  }
  e.max_restarts = static_cast<int>(restarts);
  e.step_timeout_s = config.get_double("elastic.step_timeout_s", e.step_timeout_s);
  if (!(e.step_timeout_s >= 1.0)) {
    throw_error(
        "elastic.step_timeout_s must be at least 1 (seconds a step may take before the worker "
        "counts as hung), got {}",
        e.step_timeout_s);
  }
  e.inject = config.get_string("elastic.inject", "");
  parse_faults(e.inject);  // refused here, before any worker starts
  return e;
}

Agent::Agent(AgentOptions options) : options_(std::move(options)) {
  if (options_.store != nullptr) {
    CoordinatorOptions c;
    c.nnodes = options_.nnodes;
    c.node_rank = options_.node_rank;
    c.max_restarts = options_.max_restarts;
    c.standby = options_.standby;
    c.host = options_.node_id;
    c.min_nnodes = options_.min_nnodes;
    c.train_dp = options_.train_dp;
    c.train_grad_accum = options_.train_grad_accum;
    c.worker_store = options_.worker_store;
    coordinator_.emplace(*options_.store, c, now_ns());
  }
  if (options_.standby) {
    if (!coordinator_) throw_error("a standby node's agent needs the coordinator's store");
    options_.node_rank = -1;  // until the coordinator gives it one
  }
  node_fault_raised_.assign(options_.node_faults.size(), false);
  group_rank_ = options_.node_rank;
  group_nodes_ = options_.nnodes;
}

int Agent::run(const sigset_t& child_mask) {
  start_ns_ = now_ns();
  if (options_.standby) {
    int status = 0;
    if (!wait_for_a_node(&status)) return status;
    restore_snapshot();
  }
  if (options_.chaos) {
    // A standby that took a lost node's place draws a stream of its own
    // (keyed by the generation it joined at), from now: not the lost
    // node's faults again, nor the ones due while it waited.
    chaos_.emplace(*options_.chaos, options_.node_rank, options_.nnodes,
                   options_.standby ? generation_ : 0);
    chaos_->start(options_.standby ? now_ns() : start_ns_);
  }
  for (;;) {
    if (options_.snapshot_sync) {
      options_.snapshot_sync->enter_generation(generation_, options_.node_rank,
                                               coordinator_->members());
    }
    HeartbeatTable table(options_.nproc_per_node, generation_);
    hold_for_node_faults(table);
    Environment env = options_.environment;
    env.set("BRIGADE_GENERATION", std::to_string(generation_));
    env.set("BRIGADE_HEARTBEAT_FD", std::to_string(table.fd()));
    if (machine_peak_gflops_ > 0) {
      env.set(kMachinePeakVariable, fmt::format("{:.17g}", machine_peak_gflops_));
    }
    failure_.reset();
    store_lost_.reset();
    // A generation starts on the coordinator's word, just read.
    store_answered_ns_ = now_ns();
    exits_.clear();
    will_restart_ = false;
    Outcome outcome;
    std::optional<Program> program;
    try {
      program = program_for_generation();
    } catch (const std::exception& e) {
      // Every node ends with this one line, not with a launcher that died.
      remote_failure_ = fmt::format("node {} could not start its workers of generation {}: {}",
                                    options_.node_rank, generation_, e.what());
      report_end(remote_failure_);
      return finish(Outcome::kRemoteFailure, 0);
    }
    {
      WorkerGroup group(*program, env, group_rank_ * options_.nproc_per_node,
                        options_.nproc_per_node, child_mask, table.fd());
      outcome = supervise(group, table);
    }
    if (options_.snapshot_sync) options_.snapshot_sync->freeze();
    end_generation(table);
    if (coordinator_) outcome = settle_generation(outcome);
    if (outcome == Outcome::kFailed && will_restart_) {
      // Every worker of the generation (of every node) is gone: the stop
      // phase of the incident ends here.
      if (!incidents_.empty() && incidents_.back().generation == generation_) {
        incidents_.back().stopped_ns = now_ns();
      }
      // A rejoin (a node grows the job back) uses no restart.
      const bool rejoin = failure_->kind == "rejoin";
      if (!rejoin) ++restarts_;
      ++generation_;
      restore_snapshot();
      std::string from;
      if (const auto point = resume_point()) {
        from = fmt::format(" from the {} of step {}",
                           point->from_snapshot ? "in-memory snapshot" : "checkpoint", point->step);
      }
      std::fprintf(stderr, "brigade launch: %s; restarting the workers as generation %lld (%s)%s\n",
                   failure_->what.c_str(), static_cast<long long>(generation_),
                   rejoin
                       ? "a rejoin, no restart used"
                       : fmt::format("restart {} of {}", restarts_, options_.max_restarts).c_str(),
                   from.c_str());
      std::fflush(stderr);
      continue;
    }
    return finish(outcome, stopped_count_);
  }
}

std::optional<ResumePoint> Agent::resume_point() const {
  if (!options_.brigade_train || run_dir_.empty()) return std::nullopt;
  return newest_resume_point(run_dir_, options_.snapshot_dir);
}

Program Agent::program_for_generation() const {
  Program program = options_.program;
  if (generation_ == 0) return program;
  // No checkpoint or snapshot yet: start over as the first generation did.
  const auto point = resume_point();
  if (!point) {
    for (std::string& a : fewer_nodes_args()) program.argv.push_back(std::move(a));
    return program;
  }
  std::vector<std::string> argv;
  for (size_t i = 0; i < program.argv.size(); ++i) {
    const std::string& a = program.argv[i];
    if (a == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (a.starts_with("--resume=")) continue;
    argv.push_back(a);
  }
  argv.push_back("--resume");
  // A checkpoint by its run directory: a newest one that does not verify
  // is then skipped for the one before.
  argv.push_back(point->from_snapshot ? point->dir.string() : run_dir_);
  for (std::string& a : fewer_nodes_args()) argv.push_back(std::move(a));
  program.argv = std::move(argv);
  return program;
}

Agent::Outcome Agent::supervise(WorkerGroup& group, const HeartbeatTable& table) {
  const sigset_t watched = watched_signals();
  while (group.running() > 0) {
    const int64_t wait_ms = std::max<int64_t>(
        0, std::min(group.ms_until_kill(kAgentTickMs), inject_chaos(group, table)));
    const timespec tick{static_cast<time_t>(wait_ms / 1000),
                        static_cast<long>((wait_ms % 1000) * kNsPerMs)};
    const int sig = ::sigtimedwait(&watched, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (group.stopping() && !will_restart_) {
        group.stop(SIGKILL, 0);  // a second signal: no more grace
      } else {
        received_signal_ = sig;
        will_restart_ = false;
        stopping_for_rejoin_ = false;
        stopped_count_ = group.running();
        group.stop(sig, options_.signal_grace_ms);
        report_end(fmt::format("the launcher of node {} received {}", options_.node_rank,
                               signal_name(sig)));
      }
    }
    // The job's state before the exits: a worker that exited on a rejoin's
    // SIGTERM from another node (its interrupt checkpoint saved, 128 + 15)
    // is then seen stopping with the job, not as a crash (the rejoin's key
    // is written before any node's workers are signalled).
    // Cut off from the job, the workers are reaped at once, not after
    // another call that may take its whole timeout: regain_store() tries
    // the store again.
    if (coordinator_ && !lost_coordinator_) {
      const JobView view = coordinator_->poll(now_ns());
      note_store_loss(view, table);
      follow_job(view, &group);
    }
    const std::vector<WorkerExit> exits = by_likely_cause(group.reap(), table);
    for (const WorkerExit& ended : exits) exits_[ended.worker.rank] = ended.wait_status;
    for (const WorkerExit& ended : exits) {
      if (!ended.failed() || group.stopping()) continue;
      const WorkerProgress p = table.read(ended.worker.local_rank);
      Incident incident;
      incident.kind = "crash";
      incident.rank = ended.worker.rank;
      incident.pid = ended.worker.pid;
      if (WIFSIGNALED(ended.wait_status)) incident.signal = WTERMSIG(ended.wait_status);
      if (WIFEXITED(ended.wait_status)) incident.exit_code = WEXITSTATUS(ended.wait_status);
      incident.what = fmt::format("worker rank {} (local {}, node {}) {}", ended.worker.rank,
                                  ended.worker.local_rank, options_.node_rank,
                                  describe_exit(ended.wait_status));
      incident.injected = p.fault_ns > 0;
      incident.fault_ns = incident.injected ? p.fault_ns : p.beat_ns;
      incident.detected_ns = now_ns();
      if (incident.fault_ns == 0) incident.fault_ns = incident.detected_ns;
      on_failure(group, table, std::move(incident));
    }
    group.enforce_grace();
    if (!group.stopping()) check_watchdog(group, table);
    if (generation_ > 0) check_recovery(table);
    publish_status(group, table);
    learn_run_dir(table);
    if (options_.snapshot_sync && !group.stopping()) options_.snapshot_sync->tick();
    if (group.stopping()) {
      table.hold_after(0);  // a held worker would not see its signal
    } else {
      raise_node_fault(group, table);
    }
  }
  if (received_signal_ != 0) return Outcome::kSignalled;
  if (failure_) return Outcome::kFailed;
  if (!remote_failure_.empty()) return Outcome::kRemoteFailure;
  return Outcome::kSucceeded;
}

AgentStatus Agent::status() const {
  const std::lock_guard<std::mutex> lock(status_mutex_);
  return status_;
}

void Agent::publish_status(const WorkerGroup& group, const HeartbeatTable& table) {
  AgentStatus s;
  s.node_rank = options_.node_rank;
  s.generation = generation_;
  s.restarts = restarts_;
  s.incidents = static_cast<int>(std::count_if(incidents_.begin(), incidents_.end(),
                                               [](const Incident& i) { return i.failure(); }));
  s.taken_ns = now_ns();
  for (const Worker& w : group.workers()) {
    s.workers.push_back({w.rank, w.local_rank, w.running, table.read(w.local_rank)});
  }
  const std::lock_guard<std::mutex> lock(status_mutex_);
  status_ = std::move(s);
}

void Agent::check_watchdog(WorkerGroup& group, const HeartbeatTable& table) {
  const int64_t now = now_ns();
  for (const Worker& w : group.workers()) {
    if (!w.running) continue;
    const WorkerProgress p = table.read(w.local_rank);
    const bool stopped = beat_is_late(p, now, options_.watchdog) && stopped_by_signal(w.pid);
    const std::optional<Stall> stall = check_progress(p, now, options_.watchdog, stopped);
    if (!stall) continue;
    Incident incident;
    incident.kind = "hang";
    incident.rank = w.rank;
    incident.pid = w.pid;
    incident.what = fmt::format("worker rank {} (local {}, node {}, pid {}) {}", w.rank,
                                w.local_rank, options_.node_rank, w.pid, stall->what);
    incident.injected = p.fault_ns > 0;
    incident.fault_ns = incident.injected ? p.fault_ns : stall->since_ns;
    incident.detected_ns = now;
    on_failure(group, table, std::move(incident));
    return;
  }
}

void Agent::measure_progress(const HeartbeatTable& table, Incident& incident) {
  // The last step any worker completed, and how long steps took.
  int64_t start_step = -1, train_ns = 0;
  for (int r = 0; r < table.slots(); ++r) {
    const WorkerProgress p = table.read(r);
    incident.last_step = std::max(incident.last_step, p.step);
    if (r == 0) {
      start_step = p.start_step;
      train_ns = p.train_ns;
    }
  }
  learn_run_dir(table);
  if (start_step >= 0 && incident.last_step > start_step) {
    incident.mean_step_ms = train_ns * 1e-6 / static_cast<double>(incident.last_step - start_step);
  }
}

void Agent::on_failure(WorkerGroup& group, const HeartbeatTable& table, Incident incident) {
  // The previous failure's recovery first: this generation may have
  // completed its steps and failed again between two looks.
  if (generation_ > 0) check_recovery(table);
  // Not recovered (overtaken): its redone steps still count as lost.
  note_resumed_from(incidents_, generation_, table.read(0).start_step);
  incident.generation = generation_;
  measure_progress(table, incident);
  gather_evidence(group, table, incident);
  progress_.account(incident);  // steps lost from the highest step the job completed
  will_restart_ = restarts_ < options_.max_restarts && received_signal_ == 0;
  // A hung worker still runs, but it is the failure, not one of the others.
  stopped_count_ = group.running() - (incident.kind == "hang" ? 1 : 0);
  if (will_restart_) {
    group.stop(SIGKILL, 0);
  } else {
    group.stop(SIGTERM, options_.failure_grace_ms);
  }
  failure_ = incident;
  if (!coordinator_) {
    incidents_.push_back(std::move(incident));
    return;
  }
  // Across nodes the job's incident is the coordinator's pick among every
  // node's reports (record_job_incident).
  if (failing_seen_ns_ == 0) failing_seen_ns_ = now_ns();
  try {
    coordinator_->report_failure(std::move(incident));
  } catch (const Error& e) {
    std::fprintf(stderr, "brigade launch: could not tell the coordinator: %s\n", e.what());
  }
}

void Agent::gather_evidence(const WorkerGroup& group, const HeartbeatTable& table,
                            Incident& incident) {
  if (run_dir_.empty()) return;  // not `brigade train`: no flight recorder to ask
  // Across nodes the agent beats on while it waits and reads (a silent
  // agent is a lost node to the leader).
  std::function<void()> keep_alive;
  if (coordinator_) keep_alive = [this] { coordinator_->keep_alive(now_ns()); };
  const fs::path dir =
      keep_evidence(group, table, exits_, run_dir_, options_.node_rank, options_.nproc_per_node,
                    incident_base_.value_or(0) + generation_ + 1, incident, keep_alive);
  if (dir.empty() || !options_.diagnose) return;
  if (keep_alive) keep_alive();
  try {
    incident.cause = options_.diagnose(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade launch: no root cause for %s: %s\n", dir.c_str(), e.what());
  }
  if (keep_alive) keep_alive();
  if (!incident.cause.empty()) {
    std::fprintf(stderr, "brigade launch: %s\n", incident.cause.c_str());
    std::fflush(stderr);
  }
}

void Agent::check_recovery(const HeartbeatTable& table) {
  if (incidents_.empty() || incidents_.back().recovered_ns) return;
  Incident& pending = incidents_.back();
  if (pending.generation + 1 != generation_) return;
  // Recovered when every worker of the new generation completed a step;
  // each phase ends when its last worker got there.
  int64_t latest = 0, mesh = 0, ready = 0;
  for (int r = 0; r < table.slots(); ++r) {
    const WorkerProgress p = table.read(r);
    if (p.first_step_ns == 0) return;
    latest = std::max(latest, p.first_step_ns);
    mesh = std::max(mesh, p.mesh_ns);
    ready = std::max(ready, p.ready_ns);
    if (r == 0) pending.resumed_from_step = p.start_step;
  }
  pending.recovered_ns = latest;
  pending.mesh_ns = mesh;
  pending.ready_ns = ready;
  std::fprintf(stderr, "brigade launch: recovered %.0f ms after the fault (%s), %lld step%s lost\n",
               (latest - pending.fault_ns) * 1e-6, pending.recovery_line().c_str(),
               static_cast<long long>(pending.steps_lost().value_or(0)),
               pending.steps_lost().value_or(0) == 1 ? "" : "s");
  std::fflush(stderr);
  write_incidents(/*final=*/false);
}

void Agent::end_generation(const HeartbeatTable& table) {
  GenerationRecord record;
  const WorkerProgress first = table.read(0);
  record.start_step = first.start_step;
  record.last_step = first.step;
  record.train_ns = first.train_ns;
  record.ready_ns = first.ready_ns;
  // Measured once per job (0.6 s or more of every restart otherwise).
  if (machine_peak_gflops_ == 0 && first.peak_gflops > 0 && std::isfinite(first.peak_gflops)) {
    machine_peak_gflops_ = first.peak_gflops;
  }
  if (first.step > first.start_step) record.step_end_ns = first.step_ns;
  progress_.saw(first.step);
  learn_run_dir(table);
  // A generation that failed before its first step still says where it resumed.
  note_resumed_from(incidents_, generation_, first.start_step);
  generations_.push_back(record);
}

void Agent::learn_run_dir(const HeartbeatTable& table) {
  for (int r = 0; r < table.slots() && run_dir_.empty(); ++r) run_dir_ = table.read(r).run_dir;
  // For a standby that takes a node's place: it resumes from there. Tried
  // again on every tick until the store took it.
  if (!run_dir_published_ && !run_dir_.empty() && coordinator_ && coordinator_->leader()) {
    try {
      coordinator_->publish_run_dir(run_dir_);
      run_dir_published_ = true;
    } catch (const Error& e) {
      std::fprintf(stderr, "brigade launch: could not tell the coordinator: %s\n", e.what());
    }
  }
  if (!run_dir_.empty() && !incident_base_) incident_base_ = last_incident_number(run_dir_);
}

void Agent::write_incidents(bool final) {
  // Across nodes the leader's agent writes them all: it hears of every
  // node's (node 0's, or with etcd the one that took over).
  if (!writes_run_records()) {
    // The leader writes a recovered incident as this agent sees it
    // recovered: a follower that takes over later (etcd) does not write it
    // again.
    for (Incident& i : incidents_) i.written = i.written || i.recovered_ns.has_value();
    return;
  }
  const fs::path path = fs::path(run_dir_) / "incidents.jsonl";
  try {
    for (Incident& i : incidents_) {
      if (i.written || (!final && !i.recovered_ns)) continue;
      const int64_t number = incident_base_.value_or(0) + i.generation + 1;
      nlohmann::json line = i.to_json();
      line["number"] = number;  // its evidence: incidents/<number>/
      // Whose monotonic clock the *_unix_us stamps were converted from
      // (diag/trace_incidents.h).
      line["boot_id"] = boot_id();
      append_json_line(path, line);
      i.written = true;
      const fs::path evidence = incident_dir(run_dir_, number);
      if (options_.resolved && fs::is_directory(evidence)) options_.resolved(evidence);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "brigade launch: %s\n", e.what());
  }
}

void Agent::keep_newest_snapshot() const {
  const auto point = resume_point();
  if (!point || !point->from_snapshot) return;
  // Copied beside the checkpoints under a temporary name, then renamed (a
  // step directory is complete or absent, as the checkpoint layer promises),
  // gaining the shard checksums a snapshot leaves out.
  fs::path kept;
  try {
    kept = copy_checkpoint(point->dir, fs::path(run_dir_) / "checkpoints");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade launch: could not keep the in-memory snapshot of step %lld: %s\n",
                 static_cast<long long>(point->step), e.what());
    return;
  }
  std::fprintf(stderr,
               "brigade launch: kept the in-memory snapshot of step %lld as %s (newer than any "
               "checkpoint): --resume %s continues from it\n",
               static_cast<long long>(point->step), kept.c_str(), run_dir_.c_str());
}

bool Agent::writes_run_records() const {
  if (run_dir_.empty()) return false;
  return coordinator_ ? coordinator_->leader() && !cut_off_from_job() : options_.node_rank == 0;
}

bool Agent::cut_off_from_job() const {
  return lost_coordinator_ && coordinator_ && coordinator_->elects_leader();
}

int Agent::finish(Outcome outcome, int stopped) {
  write_incidents(/*final=*/true);
  // A leader cut off from an electing store has nothing to release: the
  // job goes on under another leader.
  if (coordinator_ && coordinator_->leader() && !cut_off_from_job()) {
    try {
      coordinator_->release_standbys();
    } catch (const Error& e) {
      std::fprintf(stderr, "brigade launch: could not release the standby nodes: %s\n", e.what());
    }
  }
  // The snapshots go with the agent; the newest state must not.
  if (outcome != Outcome::kSucceeded && !cut_off_from_job()) keep_newest_snapshot();
  if (options_.brigade_train && writes_run_records()) {
    const RunSummary summary = summarize(incidents_, generations_, restarts_, start_ns_, now_ns());
    std::fprintf(stderr, "brigade launch: %s\n", summary.line().c_str());
    nlohmann::json line = summary.to_json();
    // When this launch ended: a straggler episode still open ends here
    // (diag/trace_incidents.h).
    line["unix_us"] = unix_us_now();
    if (options_.chaos) {
      line["chaos_mtbf_s"] = options_.chaos->mtbf_s;
      line["chaos_raised"] = chaos_raised_;
      line["chaos_skipped"] = chaos_skipped_;
    }
    // Also the last record of metrics.jsonl (no "step": readers of the
    // step records pass over it).
    for (const char* file : {"incidents.jsonl", "metrics.jsonl"}) {
      try {
        append_json_line(fs::path(run_dir_) / file, line);
      } catch (const Error& e) {
        std::fprintf(stderr, "brigade launch: %s\n", e.what());
      }
    }
  }
  const std::string after =
      restarts_ > 0 ? fmt::format(" (after {})", plural(restarts_, "restart")) : "";
  switch (outcome) {
    case Outcome::kSucceeded:
      return 0;
    case Outcome::kFailed:
      std::fprintf(stderr, "brigade launch: %s%s; stopped the other %s\n", failure_->what.c_str(),
                   after.c_str(), plural(stopped, "worker").c_str());
      return 1;
    case Outcome::kRemoteFailure:
      std::fprintf(stderr, "brigade launch: stopped %s on node %d: %s\n",
                   plural(stopped, "worker").c_str(), options_.node_rank, remote_failure_.c_str());
      return 1;
    case Outcome::kSignalled:
      std::fprintf(stderr, "brigade launch: received %s; stopped %s\n",
                   signal_name(received_signal_).c_str(), plural(stopped, "worker").c_str());
      return 128 + received_signal_;
  }
  return 1;
}

void Agent::report_end(const std::string& why) {
  if (!coordinator_) return;
  try {
    coordinator_->report_end(why);
  } catch (const Error& e) {
    std::fprintf(stderr, "brigade launch: could not tell the other nodes: %s\n", e.what());
  }
}

}  // namespace brigade::elastic

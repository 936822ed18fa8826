// The agent's part in a multi-node job: following the coordinator
// (elastic/coordinator.h). Kept apart from agent.cc, which supervises one
// node's workers and is the same on one node and many.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/agent.h"
#include "brigade/elastic/snapshot_sync.h"
#include "brigade/elastic/snapshots.h"

namespace brigade::elastic {
namespace {

// `ip link set dev IFACE down`; the error, or "".
std::string take_interface_down(const std::string& iface) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execlp("ip", "ip", "link", "set", "dev", iface.c_str(), "down", nullptr);
    ::_exit(127);
  }
  if (pid < 0) return std::strerror(errno);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return fmt::format("`ip link set dev {} down` {}", iface,
                     WIFEXITED(status) && WEXITSTATUS(status) == 127
                         ? "could not run (is iproute2 installed?)"
                         : "failed (it needs root: CAP_NET_ADMIN)");
}

}  // namespace

bool Agent::wait_for_a_node(int* status) {
  using State = JobView::State;
  std::fprintf(stderr,
               "brigade launch: standby node %d waits to take the place of a lost node (or to "
               "rejoin the job while it runs on fewer nodes)\n",
               coordinator_->standby_id());
  std::fflush(stderr);
  const sigset_t watched = watched_signals();
  for (;;) {
    const JobView view = coordinator_->poll(now_ns());
    switch (view.state) {
      case State::kRestart:
        options_.node_rank = coordinator_->node_rank();
        generation_ = coordinator_->generation();
        // The job's restarts so far, as the other nodes count them.
        restarts_ = static_cast<int>(coordinator_->restarts_used());
        // Its workers resume where the job's are (no worker of its own has
        // said so yet).
        run_dir_ = view.run_dir;
        take_membership();
        std::fprintf(stderr,
                     "brigade launch: standby node %d takes the place of node %d: starting its "
                     "workers as generation %lld\n",
                     coordinator_->standby_id(), options_.node_rank,
                     static_cast<long long>(generation_));
        std::fflush(stderr);
        return true;
      case State::kSucceeded:
        std::fprintf(stderr, "brigade launch: the job is over; standby node %d was not needed\n",
                     coordinator_->standby_id());
        *status = 0;
        return false;
      case State::kEnded:
        lost_coordinator_ = view.lost_coordinator;
        std::fprintf(stderr, "brigade launch: standby node %d: the job ended: %s\n",
                     coordinator_->standby_id(), view.why.c_str());
        *status = 1;
        return false;
      case State::kRunning:
      case State::kFailing:
        break;
    }
    const timespec tick{0, kAgentTickMs * kNsPerMs};
    const int sig = ::sigtimedwait(&watched, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      // A standby's signal concerns it alone: the job goes on without it.
      std::fprintf(stderr, "brigade launch: standby node %d received %s; leaving\n",
                   coordinator_->standby_id(), signal_name(sig).c_str());
      *status = 128 + sig;
      return false;
    }
  }
}

void Agent::hold_for_node_faults(const HeartbeatTable& table) const {
  int64_t step = 0;
  for (size_t i = 0; i < options_.node_faults.size(); ++i) {
    const NodeFault& fault = options_.node_faults[i];
    // A hold raised goes on holding, until the generation stops.
    if ((node_fault_raised_[i] && fault.kind != NodeFault::Kind::kHold) ||
        fault.node != options_.node_rank || fault.generation != generation_) {
      continue;
    }
    step = step == 0 ? fault.step : std::min(step, fault.step);
  }
  table.hold_after(step);
}

void Agent::raise_node_fault(WorkerGroup& group, const HeartbeatTable& table) {
  for (size_t i = 0; i < options_.node_faults.size(); ++i) {
    const NodeFault& fault = options_.node_faults[i];
    if (node_fault_raised_[i] || fault.node != options_.node_rank ||
        fault.generation != generation_) {
      continue;
    }
    // Once every worker of the node completed the step, and its snapshot
    // of it (if any) is replicated: what a fault at that step would find.
    bool due = true;
    for (int r = 0; r < table.slots() && due; ++r) due = table.read(r).step >= fault.step;
    if (!due) continue;
    if (options_.snapshot_sync && !options_.snapshot_sync->caught_up(fault.step, now_ns())) {
      continue;
    }
    node_fault_raised_[i] = true;
    if (fault.kind == NodeFault::Kind::kHold) {
      std::fprintf(stderr,
                   "brigade launch: holding node %d's workers after step %lld (generation %lld) "
                   "until the generation stops\n",
                   fault.node, static_cast<long long>(fault.step),
                   static_cast<long long>(generation_));
      std::fflush(stderr);
      continue;
    }
    std::fprintf(stderr,
                 "brigade launch: injecting %s on node %d after step %lld (generation %lld)\n",
                 fault.name(), fault.node, static_cast<long long>(fault.step),
                 static_cast<long long>(generation_));
    std::fflush(stderr);
    strike_node(fault, group);
    // Cut off: the workers go on into collectives that cannot complete.
    hold_for_node_faults(table);
  }
}

std::string Agent::strike_node(const NodeFault& fault, WorkerGroup& group) {
  if (coordinator_) {
    try {
      coordinator_->mark_node_fault(fault.name());
    } catch (const Error& e) {
      std::fprintf(stderr, "brigade launch: could not tell the coordinator: %s\n", e.what());
    }
  }
  if (fault.kind == NodeFault::Kind::kKillAgent) {
    // The whole node at once: its workers first (each its own process
    // group), so that none outlives the agent even for the moment
    // PR_SET_PDEATHSIG takes.
    for (const Worker& w : group.workers()) {
      if (w.running) ::kill(-w.pid, SIGKILL);
    }
    ::kill(::getpid(), SIGKILL);
  }
  const std::string error = take_interface_down(options_.partition_iface);
  if (!error.empty()) {
    std::fprintf(stderr, "brigade launch: the partition fault did not cut node %d: %s\n",
                 options_.node_rank, error.c_str());
    std::fflush(stderr);
  }
  return error;
}

void Agent::follow_job(const JobView& view, WorkerGroup* group) {
  using State = JobView::State;
  if (view.state == State::kFailing || view.state == State::kEnded) {
    if (failing_seen_ns_ == 0) failing_seen_ns_ = now_ns();
  }
  if (view.state == State::kEnded) {
    remote_failure_ = view.why;
    lost_nodes_ = view.lost_nodes;
    lost_coordinator_ = view.lost_coordinator;
    record_job_incident(view);
  }
  if (group == nullptr) return;
  if (group->stopping()) {
    // A stop begun as a rejoin's (the signal's grace) that a failure or a
    // lost node joined: the failure's stop, as if it had come first.
    if (stopping_for_rejoin_ && view.state == State::kFailing && !view.rejoin) {
      stopping_for_rejoin_ = false;
      will_restart_ = view.will_restart && received_signal_ == 0;
      group->stop(will_restart_ ? SIGKILL : SIGTERM, will_restart_ ? 0 : options_.failure_grace_ms);
    }
    return;
  }
  stopping_for_rejoin_ = view.state == State::kFailing && view.rejoin;
  if (view.state == State::kFailing) {
    // A failure on another node (or this one's, already stopping): the
    // survivors' state is disposable, as on one node.
    will_restart_ = view.will_restart && received_signal_ == 0;
    stopped_count_ = group->running();
    if (view.rejoin) {
      // Not a failure: the workers agree on a step boundary and save there
      // (elastic/coordinator_rejoin.cc), as on a launcher's signal.
      group->stop(SIGTERM, options_.signal_grace_ms);
    } else if (will_restart_) {
      group->stop(SIGKILL, 0);
    } else {
      group->stop(SIGTERM, options_.failure_grace_ms);
    }
  } else if (view.state == State::kEnded) {
    will_restart_ = false;
    stopped_count_ = group->running();
    if (view.lost_coordinator) {
      // Cut off, or declared lost: the job may go on without this node, a
      // standby writing the same run directory. No grace: a worker's
      // checkpoint written now would land among the replacement's.
      group->stop(SIGKILL, 0);
    } else {
      // Another launcher's signal: the workers may be writing the interrupt
      // checkpoint, a collective with that node's, which get as long.
      group->stop(SIGTERM, view.signal ? options_.signal_grace_ms : options_.failure_grace_ms);
    }
  }
}

void Agent::note_store_loss(const JobView& view, const HeartbeatTable& table) {
  if (!view.store_unreachable) {
    store_answered_ns_ = now_ns();
    return;
  }
  if (store_lost_ || !view.lost_coordinator || received_signal_ != 0) return;
  Incident incident;
  incident.kind = "store_lost";
  incident.rank = -1;  // the node's, not one worker's
  incident.node = options_.node_rank;
  incident.generation = generation_;
  incident.fault_ns = store_answered_ns_;
  incident.detected_ns = now_ns();
  incident.what = view.why;
  measure_progress(table, incident);
  progress_.account(incident);
  store_lost_ = std::move(incident);
}

bool Agent::regain_store(bool report) {
  if (report && !store_lost_) return false;
  const int64_t give_up_ns = store_answered_ns_ + 2 * coordinator_->agent_timeout_ms() * kNsPerMs;
  const sigset_t watched = watched_signals();
  for (;;) {
    const int64_t now = now_ns();
    std::optional<Incident> incident;
    if (report) {
      incident = *store_lost_;
      // The job learns of it only now: the detection, as the leader places
      // the fault, ends here.
      incident->detected_ns = now;
      incident->what = fmt::format(
          "node {} lost the coordinator's store for {:.1f} s and its agent stopped its workers "
          "({})",
          options_.node_rank, (now - incident->fault_ns) * 1e-9, store_lost_->what);
    }
    try {
      if (const auto out = coordinator_->regain_store(incident, now)) {
        // Declared lost, deposed, or the job ended: the view says why (and
        // an end is no longer a lost coordinator's: it is read as such).
        follow_job(*out, nullptr);
        return false;
      }
      const std::string what =
          report ? incident->what
                 : fmt::format("node {} lost the coordinator's store for {:.1f} s",
                               options_.node_rank, (now - store_answered_ns_) * 1e-9);
      std::fprintf(stderr, "brigade launch: %s; it reached the store again%s\n", what.c_str(),
                   report ? ": restarting in place" : "");
      std::fflush(stderr);
      store_answered_ns_ = now;
      lost_coordinator_ = false;
      if (report) {
        remote_failure_.clear();
        if (!failure_) failure_ = std::move(*incident);
      }
      return true;
    } catch (const Error&) {
      // Not yet: the store still does not answer.
    }
    if (now_ns() >= give_up_ns) return false;
    const timespec tick{0, kAgentTickMs * kNsPerMs};
    const int sig = ::sigtimedwait(&watched, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      // The launcher's signal ends the job on every node, as anywhere else.
      received_signal_ = sig;
      report_end(
          fmt::format("the launcher of node {} received {}", options_.node_rank, signal_name(sig)));
      return false;
    }
  }
}

Agent::Outcome Agent::settle_generation(Outcome outcome) {
  using State = JobView::State;
  // Cut off from the job (its store unreachable for longer than a call,
  // deposed, or declared lost): this node leaves, unless the store answers
  // again while the leader still counts it in (regain_store()): it then
  // reports the loss as its own failure, and every node restarts in place.
  // Had it only reported its generation stopped after a short cut, it
  // would wait as a member without a failure report that any leader
  // decides on, its peers' workers in collectives with its killed ones
  // (under etcd, with every node cut by the same blip, forever). A node
  // that leaves is found silent by the leader, which goes on without it or
  // ends the job. Nor does it restart its workers by itself: a failure of
  // its own that came first had set will_restart_, and no generation
  // follows without the coordinator.
  auto leave = [this] {
    will_restart_ = false;
    return failure_ ? Outcome::kFailed : Outcome::kRemoteFailure;
  };
  if (lost_coordinator_) {
    if (outcome == Outcome::kSignalled ||
        (!regain_store(/*report=*/true) && received_signal_ != 0)) {
      will_restart_ = false;
      return Outcome::kSignalled;  // exits 128 + the signal
    }
    if (lost_coordinator_) return leave();
  }
  // The store lost once this node's part is in (its failure reported, its
  // stop being reported or the decision awaited; an etcd blip cuts every
  // node at once, the leader too): back in time, it only beats again and
  // goes on waiting. True to look again (back, or the job's end to read);
  // false to leave, remote_failure_ saying why, or on a signal.
  auto regained = [&](const std::string& why) {
    const std::string said = remote_failure_;
    remote_failure_ = why;
    lost_coordinator_ = true;
    if (regain_store(/*report=*/false)) {
      remote_failure_ = said;
      return true;
    }
    return !lost_coordinator_ && received_signal_ == 0;
  };
  auto signalled = [this] {
    will_restart_ = false;
    stopped_count_ = 0;  // stopped before the signal came
    return Outcome::kSignalled;
  };
  for (;;) {
    try {
      coordinator_->report_stopped(outcome == Outcome::kSucceeded);
      break;
    } catch (const NotLeader&) {
      // Another node leads now: it decides this generation, not this node.
      remote_failure_ = coordinator_->deposed_view().why;
      lost_coordinator_ = true;
      return leave();
    } catch (const Error& e) {
      const std::string why = fmt::format("lost contact with the coordinator: {}", e.what());
      // Node 0's own store (the built-in backend) is nothing to wait for,
      // nor is any store once the launcher had a signal.
      if (outcome == Outcome::kSignalled ||
          (coordinator_->leader() && !coordinator_->elects_leader())) {
        remote_failure_ = why;
        lost_coordinator_ = !coordinator_->leader() || coordinator_->elects_leader();
        return leave();
      }
      if (regained(why)) continue;
      if (received_signal_ != 0) return signalled();
      return leave();
    }
  }
  if (outcome == Outcome::kSignalled) return outcome;
  const sigset_t watched = watched_signals();
  for (;;) {
    const JobView view = coordinator_->poll(now_ns());
    if (view.store_unreachable && view.lost_coordinator) {
      if (regained(view.why)) continue;
      if (received_signal_ != 0) return signalled();
      return leave();
    }
    if (!view.store_unreachable) store_answered_ns_ = now_ns();
    follow_job(view, nullptr);
    switch (view.state) {
      case State::kSucceeded:
        return Outcome::kSucceeded;
      case State::kRestart:
        record_job_incident(view);
        coordinator_->enter_next_generation();
        take_membership();
        if (!failure_ || view.cause->node != options_.node_rank) {
          Incident cause = *view.cause;
          cause.what = fmt::format("node {}: {}", cause.node, cause.what);
          failure_ = cause;
        }
        will_restart_ = true;
        failing_seen_ns_ = 0;
        return Outcome::kFailed;
      case State::kEnded:
        // This node's own failure, the job's cause, is said as on one node.
        if (failure_ && view.cause && view.cause->node == options_.node_rank &&
            view.cause->rank == failure_->rank && view.cause->kind == failure_->kind) {
          will_restart_ = false;
          return Outcome::kFailed;
        }
        return Outcome::kRemoteFailure;
      case State::kRunning:
      case State::kFailing:
        break;
    }
    // The other nodes are still stopping (or still training): look again
    // soon, and take the user's signal meanwhile.
    const timespec tick{0, kAgentTickMs * kNsPerMs};
    const int sig = ::sigtimedwait(&watched, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      received_signal_ = sig;
      stopped_count_ = 0;
      report_end(
          fmt::format("the launcher of node {} received {}", options_.node_rank, signal_name(sig)));
      return Outcome::kSignalled;
    }
  }
}

void Agent::record_job_incident(const JobView& view) {
  if (!view.cause) return;
  if (!incidents_.empty() && incidents_.back().generation == generation_) return;
  Incident incident = *view.cause;
  incident.generation = generation_;
  // This node's own report has its own clock's times; another node's
  // carries only how long its detection took, placed where this agent
  // first saw the generation fail.
  const Incident* lost = incident.rank == -1 ? coordinator_->declared_lost(incident.node) : nullptr;
  if (failure_ && incident.node == options_.node_rank && incident.rank == failure_->rank) {
    incident.fault_ns = failure_->fault_ns;
    incident.detected_ns = failure_->detected_ns;
  } else if (lost != nullptr) {
    // A node this agent declared lost, leading: its own stamps. Placed where
    // it first saw the generation fail, the silence would count twice when
    // this node's workers failed first, through a collective with the dead
    // node's (at once for a killed agent): the fault 2 s before that, and
    // the rest of the silence as the stop.
    incident.fault_ns = lost->fault_ns;
    incident.detected_ns = lost->detected_ns;
  } else {
    const int64_t seen = failing_seen_ns_ != 0 ? failing_seen_ns_ : now_ns();
    incident.fault_ns += seen;
    incident.detected_ns += seen;
  }
  incidents_.push_back(std::move(incident));
}

void Agent::take_membership() {
  const int index = coordinator_->member_index();
  const int count = coordinator_->member_count();
  if (index < 0)
    throw_error("node {} is not among the nodes of generation {}", options_.node_rank,
                coordinator_->generation());
  if (index != group_rank_ || count != group_nodes_) {
    std::fprintf(stderr,
                 "brigade launch: node %d runs as node %d of %d in generation %lld (the job "
                 "started with %d nodes)\n",
                 options_.node_rank, index, count,
                 static_cast<long long>(coordinator_->generation()), options_.nnodes);
    std::fflush(stderr);
  }
  group_rank_ = index;
  group_nodes_ = count;
  options_.environment.set("GROUP_RANK", std::to_string(index));
  // A standby's given node; a node's own rank, as the incidents name it.
  options_.environment.set("BRIGADE_NODE", std::to_string(options_.node_rank));
  options_.environment.set("WORLD_SIZE", std::to_string(count * options_.nproc_per_node));
  // With etcd the generation's leader hosts its workers' store (node 0's
  // may be gone).
  if (const auto& where = coordinator_->worker_store()) {
    options_.environment.set("MASTER_ADDR", where->host);
    options_.environment.set("MASTER_PORT", std::to_string(where->port));
  }
}

void Agent::restore_snapshot() {
  if (generation_ == 0 || !coordinator_) return;
  if (!options_.snapshot_sync) {
    // This node has no snapshots (its area could not be set up): the
    // others, which may, hear at once that it resumes from disk.
    if (options_.store == nullptr) return;
    try {
      options_.store->set(restore_key(generation_, options_.node_rank), "none");
    } catch (const Error&) {
      // A lost store: the next poll says so.
    }
    return;
  }
  // A rejoin's workers stopped at a step boundary with a checkpoint: no
  // snapshot is newer (the disk step says so too, on every node).
  int64_t disk_step = -1;
  if (failure_ && failure_->kind == "rejoin") {
    disk_step = INT64_MAX;
  } else if (!run_dir_.empty()) {
    if (const auto point = newest_resume_point(run_dir_, {})) disk_step = point->step;
  }
  // The restore can take longer than the coordinator waits for a beat.
  options_.snapshot_sync->restore(
      generation_, options_.node_rank, coordinator_->members(),
      [this] { return coordinator_->keep_alive(now_ns()); }, disk_step);
}

std::vector<std::string> Agent::fewer_nodes_args() const {
  if (!options_.brigade_train || !coordinator_) return {};
  // The leader's, scaled from node 0's layout: a node launched with another
  // config must still sum the same global batch as the others.
  const auto& layout = coordinator_->train_layout();
  if (!layout) return {};
  return {"--set", fmt::format("parallel.dp={}", layout->dp), "--set",
          fmt::format("train.grad_accum={}", layout->grad_accum)};
}

std::vector<int> Agent::nodes_out() const {
  std::vector<int> out = lost_nodes_;
  if (!coordinator_) return out;
  const auto add = [&out](int n) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  };
  const std::vector<int>& members = coordinator_->members();
  for (int n = 0; n < options_.nnodes; ++n) {
    if (std::find(members.begin(), members.end(), n) == members.end()) add(n);
  }
  // Left out of a generation this agent never entered (a signal came
  // between the leader opening it and this agent seeing it open).
  try {
    for (const int n : coordinator_->nodes_lost_unreplaced()) add(n);
  } catch (const Error& e) {
    std::fprintf(stderr, "brigade launch: could not read which nodes were lost: %s\n", e.what());
  }
  return out;
}

}  // namespace brigade::elastic
